package loadgen

import (
	"context"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/stockgate"
)

// Backlog is the pipeline's apply backlog at one moment.
type Backlog struct {
	// InFlight is the reservations the gate accepted that the database has
	// not decided yet (in the outbox, in the stream or being applied): HLEN
	// of the SKUs' res hashes.
	InFlight int64
	// Outbox is the part of InFlight the relay has not handed to the
	// stream yet (ZCARD of the outboxes).
	Outbox int64
}

// backlogLua reads a SKU's in-flight count and its outbox in one step (a
// reservation leaves the outbox before its res entry: two reads apart could
// see it in neither, or count an outbox larger than what is in flight).
var backlogLua = rueidis.NewLuaScriptReadOnly(`return {redis.call('HLEN', KEYS[1]), redis.call('ZCARD', KEYS[2])}`)

// ReadBacklog reads the backlog of skus through c, each SKU's two counts at
// one moment.
func ReadBacklog(ctx context.Context, c rueidis.Client, gate *stockgate.Gate, skus []string) (Backlog, error) {
	var b Backlog
	for _, sku := range skus {
		k := gate.KeysOf(sku)
		v, err := backlogLua.Exec(ctx, c, []string{k.Res, k.Outbox}, nil).AsIntSlice()
		if err != nil {
			return b, err
		}
		b.InFlight += v[0]
		b.Outbox += v[1]
	}
	return b, nil
}

// DrainFigures is how the consumer caught up once a run's load ended.
type DrainFigures struct {
	AtEnd Backlog // when the last answer came
	// ToZero is from the last answer until the backlog was first seen at
	// zero; Drained is false if it was not within the timeout.
	ToZero  time.Duration
	Drained bool
}

// WaitBacklogZero reads the backlog of skus at once (the load's end) and
// then every 10ms until it is zero or timeout passes.
func WaitBacklogZero(ctx context.Context, c rueidis.Client, gate *stockgate.Gate, skus []string, timeout time.Duration) (DrainFigures, error) {
	return waitBacklogZero(ctx, c, gate, skus, timeout, nil)
}

// waitBacklogZero is WaitBacklogZero; afterFirst, if set, runs once the
// backlog at the end was read (a test empties it then).
func waitBacklogZero(ctx context.Context, c rueidis.Client, gate *stockgate.Gate, skus []string, timeout time.Duration, afterFirst func()) (DrainFigures, error) {
	start := time.Now()
	var d DrainFigures
	var err error
	if d.AtEnd, err = ReadBacklog(ctx, c, gate, skus); err != nil {
		return d, err
	}
	if afterFirst != nil {
		afterFirst()
	}
	b := d.AtEnd
	for {
		if b.InFlight == 0 && b.Outbox == 0 {
			d.Drained = true
			if d.AtEnd != b { // not already zero at the end: until the read that saw it
				d.ToZero = time.Since(start)
			}
			return d, nil
		}
		if time.Since(start) > timeout {
			d.ToZero = time.Since(start)
			return d, nil
		}
		select {
		case <-ctx.Done():
			return d, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if b, err = ReadBacklog(ctx, c, gate, skus); err != nil {
			return d, err
		}
	}
}

// BacklogSlope returns the least-squares growth of the backlog, in
// reservations per second, over the samples taken between from and to
// (since the sampling started): about 0 when the consumer keeps up with
// the gate, positive when it falls behind. 0 with fewer than 2 samples.
func BacklogSlope(points []BacklogPoint, from, to time.Duration) float64 {
	var n, sx, sy, sxx, sxy float64
	for _, p := range points {
		if p.At < from || p.At > to {
			continue
		}
		x, y := p.At.Seconds(), float64(p.InFlight)
		n++
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	d := n*sxx - sx*sx
	if n < 2 || d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}
