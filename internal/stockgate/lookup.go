package stockgate

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
)

// InFlight is an atomic read of a SKU's reservations not yet closed.
type InFlight struct {
	Loaded   bool
	Epoch    string // which load of the SKU this read saw
	Reserved int64  // the monotonic reserved-units counter at the time of the read
	// Available is what the gate may still sell net of its debt: the
	// units owed because a stock decrement made outside the gate (an
	// external change, a direct sale) took more than was available. It is
	// negative while the debt exceeds the available units.
	Available int64
	// Debt is that debt: reservations already admitted that the database
	// will refuse; their give-back pays it off instead of re-selling.
	Debt int64
	// Moves is the SKU's move counter at the time of the read: bumped by
	// every change of the available units or the debt other than a
	// reservation (those are counted by Reserved).
	Moves        int64
	Reservations []sale.Reservation
}

// Gauges are a SKU's figures for the dashboard and the metrics, read
// without reading a reservation.
type Gauges struct {
	Loaded    bool
	Available int64 // avail - debt (see InFlight), when Loaded
	InFlight  int64 // reservations in flight (entries of res)
	Units     int64 // their units
	Outbox    int64 // reservations not yet acknowledged by the stream
}

// ReadGauges returns sku's gauges in one round trip that reads no entry:
// the length of res and the meta hash's running count of their units (kept
// by the scripts that add or remove entries). A split sale's are the sum
// over its buckets, read in one more round trip (pipelined, whatever the
// number of buckets). A SKU loaded by an older version has no count until
// its next seed or resync: then the entries are read (ReadInFlight).
func (g *Gate) ReadGauges(ctx context.Context, sku string) (Gauges, error) {
	gs, k, err := g.gaugesFrom(ctx, sku, g.c.DoMulti(ctx, g.gaugeCmds(sku)...))
	if err != nil || k <= 1 {
		return gs, err
	}
	// A split sale: the sum over its buckets (bucket 0 is sku itself).
	names := BucketNames(sku, k)[1:]
	cmds := make(rueidis.Commands, 0, 3*len(names))
	for _, name := range names {
		cmds = append(cmds, g.gaugeCmds(name)...)
	}
	rs := g.c.DoMulti(ctx, cmds...)
	for i, name := range names {
		b, _, err := g.gaugesFrom(ctx, name, rs[3*i:3*i+3])
		if err != nil {
			return Gauges{}, err
		}
		gs.Loaded = gs.Loaded && b.Loaded
		gs.Available += b.Available
		gs.InFlight += b.InFlight
		gs.Units += b.Units
		gs.Outbox += b.Outbox
	}
	return gs, nil
}

// gaugeCmds are the three reads of one bucket's (or an unsplit sale's)
// gauges, in the order gaugesFrom takes their answers.
func (g *Gate) gaugeCmds(name string) rueidis.Commands {
	k := g.KeysOf(name)
	return rueidis.Commands{g.c.B().Hlen().Key(k.Res).Build(),
		g.c.B().Hmget().Key(k.Meta).Field("inflight", "avail", "debt", "epoch", "buckets").Build(), g.c.B().Zcard().Key(k.Outbox).Build()}
}

// gaugesFrom is ReadGauges of one bucket (or of a sale not split) from the
// answers to gaugeCmds(name), with the number of buckets its meta hash
// records.
func (g *Gate) gaugesFrom(ctx context.Context, name string, rs []rueidis.RedisResult) (Gauges, int, error) {
	n, err := rs[0].AsInt64()
	if err != nil {
		return Gauges{}, 0, fmt.Errorf("stockgate: gauges: %w", err)
	}
	m, err := rs[1].ToArray()
	if err != nil || len(m) != 5 {
		return Gauges{}, 0, fmt.Errorf("stockgate: gauges: %w", err)
	}
	out, err := rs[2].AsInt64()
	if err != nil {
		return Gauges{}, 0, fmt.Errorf("stockgate: gauges: %w", err)
	}
	buckets := 1
	if b, err := m[4].AsInt64(); err == nil && b > 1 {
		buckets = int(b)
	}
	units, uerr := m[0].AsInt64()
	if rueidis.IsRedisNil(uerr) {
		f, err := g.ReadInFlightOf(ctx, name)
		if err != nil {
			return Gauges{}, 0, err
		}
		return Gauges{Loaded: f.Loaded, Available: f.Available, InFlight: int64(len(f.Reservations)), Units: f.Units(), Outbox: out}, buckets, nil
	}
	gs := Gauges{InFlight: n, Units: units, Outbox: out}
	gs.Loaded = !m[3].IsNil()
	avail, _ := m[1].AsInt64()
	debt, _ := m[2].AsInt64()
	gs.Available = avail - debt
	return gs, buckets, nil
}

// Units returns the total quantity of the reservations.
func (f InFlight) Units() int64 {
	var n int64
	for _, r := range f.Reservations {
		n += r.Quantity
	}
	return n
}

// ReadInFlight returns, in one atomic step, the SKU's in-flight reservations,
// its reserved counter and available units (entries are returned even when
// the SKU is not loaded).
func (g *Gate) ReadInFlight(ctx context.Context, sku string) (InFlight, error) {
	if n, err := g.Buckets(ctx, sku); err != nil {
		return InFlight{}, err
	} else if n > 1 {
		return g.readInFlightBuckets(ctx, sku, n)
	}
	return g.ReadInFlightOf(ctx, sku)
}

// ReadInFlightOf is ReadInFlight of one bucket (or of a sale not split).
func (g *Gate) ReadInFlightOf(ctx context.Context, sku string) (InFlight, error) {
	k := g.KeysOf(sku)
	vals, err := g.inflight.Exec(ctx, g.c, []string{k.Meta, k.Res}, nil).ToArray()
	if err != nil {
		return InFlight{}, fmt.Errorf("stockgate: read in-flight: %w", err)
	}
	loaded, _ := vals[0].AsInt64()
	var f InFlight
	f.Loaded = loaded == 1
	f.Reserved, _ = vals[1].AsInt64()
	f.Available, _ = vals[2].AsInt64()
	if len(vals) > 4 {
		f.Epoch, _ = vals[4].ToString()
	}
	f.Debt, _ = vals[5].AsInt64()
	if len(vals) > 6 {
		f.Moves, _ = vals[6].AsInt64()
	}
	kv, err := vals[3].AsStrSlice()
	if err != nil {
		return InFlight{}, fmt.Errorf("stockgate: read in-flight: %w", err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		var r sale.Reservation
		if err := json.Unmarshal([]byte(kv[i+1]), &r); err != nil {
			return InFlight{}, fmt.Errorf("stockgate: in-flight entry %s: %w", kv[i], err)
		}
		f.Reservations = append(f.Reservations, r)
	}
	return f, nil
}

// Available returns the units available in Redis (for a split sale the sum
// over its buckets, units in transfer included); ok is false when the SKU
// is not loaded.
func (g *Gate) Available(ctx context.Context, sku string) (n int64, ok bool, err error) {
	// One read for a sale in one bucket: its avail and its number of buckets.
	m, err := g.c.Do(ctx, g.c.B().Hmget().Key(g.KeysOf(sku).Meta).Field("avail", "buckets").Build()).ToArray()
	if err != nil {
		return 0, false, fmt.Errorf("stockgate: available: %w", err)
	}
	if k, err := m[1].AsInt64(); err == nil && k > 1 {
		bs, err := g.ReadBuckets(ctx, BucketNames(sku, int(k)), false)
		if err != nil {
			return 0, false, err
		}
		for _, b := range bs {
			if !b.Loaded {
				return 0, false, nil
			}
			n += b.Avail + b.Transit
		}
		return n, true, nil
	}
	n, err = m[0].AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("stockgate: available: %w", err)
	}
	return n, true, nil
}

// Held returns the units user holds of sku according to Redis.
func (g *Gate) Held(ctx context.Context, sku, user string) (int64, error) {
	k, err := g.Buckets(ctx, sku)
	if err != nil {
		return 0, err
	}
	n, err := g.c.Do(ctx, g.c.B().Hget().Key(g.KeysOf(HomeName(sku, user, k)).Buyers).Field(user).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return n, err
}

// Lookup returns the in-flight reservation orderID of any of skus, if one
// holds it. One round trip asks every SKU's bucket 0 and its bucket count
// at once (the look-ups of several SKUs are pipelined); only a split sale
// whose bucket 0 does not hold the order costs a second, asking its other
// buckets.
func (g *Gate) Lookup(ctx context.Context, orderID string, skus ...string) (sale.Reservation, bool, error) {
	cmds := make(rueidis.Commands, 0, 2*len(skus))
	for _, sku := range skus {
		k := g.KeysOf(sku)
		cmds = append(cmds, g.c.B().Hget().Key(k.Res).Field(orderID).Build(),
			g.c.B().Hget().Key(k.Meta).Field("buckets").Build())
	}
	b, more, err := g.firstHeld(ctx, cmds, func(i int) bool { return i%2 == 0 })
	if err != nil {
		return sale.Reservation{}, false, err
	}
	if b == nil && len(more) > 0 {
		// more holds the bucket-count answers: ask the split sales' other buckets.
		cmds = cmds[:0]
		for i, sku := range skus {
			n, err := more[2*i+1].AsInt64()
			if err != nil || n <= 1 {
				continue
			}
			for _, name := range BucketNames(sku, int(n))[1:] {
				cmds = append(cmds, g.c.B().Hget().Key(g.KeysOf(name).Res).Field(orderID).Build())
			}
		}
		if len(cmds) > 0 {
			if b, _, err = g.firstHeld(ctx, cmds, func(int) bool { return true }); err != nil {
				return sale.Reservation{}, false, err
			}
		}
	}
	if b == nil {
		return sale.Reservation{}, false, nil
	}
	var r sale.Reservation
	if err := json.Unmarshal(b, &r); err != nil {
		return sale.Reservation{}, false, fmt.Errorf("stockgate: lookup %s: %w", orderID, err)
	}
	return r, true, nil
}

// firstHeld sends cmds at once and returns the first answer of a command
// picked by isRes that holds a value; with none, every answer (to read the
// others from).
func (g *Gate) firstHeld(ctx context.Context, cmds rueidis.Commands, isRes func(int) bool) ([]byte, []rueidis.RedisResult, error) {
	rs := g.c.DoMulti(ctx, cmds...)
	for i, r := range rs {
		if !isRes(i) {
			continue
		}
		v, err := r.AsBytes()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("stockgate: lookup: %w", err)
		}
		return v, nil, nil
	}
	return nil, rs, nil
}

// Pending is an outbox entry: a reservation not yet acknowledged by the stream.
type Pending struct {
	OrderID string
	Payload []byte // nil if the reservation is already closed (just drop the entry)
}

// Outbox returns up to limit outbox entries of sku accepted at or before before.
func (g *Gate) Outbox(ctx context.Context, sku string, before time.Time, limit int) ([]Pending, error) {
	k := g.KeysOf(sku)
	ids, err := g.c.Do(ctx, g.c.B().Zrange().Key(k.Outbox).Min("-inf").Max(strconv.FormatInt(before.UnixMilli(), 10)).
		Byscore().Limit(0, int64(limit)).Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("stockgate: outbox: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	vals, err := g.c.Do(ctx, g.c.B().Hmget().Key(k.Res).Field(ids...).Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("stockgate: outbox payloads: %w", err)
	}
	out := make([]Pending, len(ids))
	for i, id := range ids {
		out[i].OrderID = id
		if b, err := vals[i].AsBytes(); err == nil {
			out[i].Payload = b
		}
	}
	return out, nil
}

// OutboxLen returns the number of outbox entries of sku.
// For a sale split in buckets, it is the sum over them.
func (g *Gate) OutboxLen(ctx context.Context, sku string) (int64, error) {
	k, err := g.Buckets(ctx, sku)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, n := range BucketNames(sku, k) {
		v, err := g.c.Do(ctx, g.c.B().Zcard().Key(g.KeysOf(n).Outbox).Build()).AsInt64()
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total, nil
}
