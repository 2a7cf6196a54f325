package room

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"
)

// The admission controller. One instance per room holds the lease (SET NX
// PX, renewed each tick by lease.lua) and advances served; the others only
// try the lease. A holder that dies stops renewing and another takes over
// once the lease expires. Everything that matters is in Redis: served and
// its fraction, the rate, the stock seen and conv (a new leader starts from
// the last conv). The leader's memory holds only the samples that measure
// conv, rebuilt within one admission TTL.

const (
	convMin    = 0.05 // conv never goes below: at most 20 admissions per expected buyer
	convSample = 20   // positions served in the window before conv is measured
)

// Tick is what one controller step did for one room.
type Tick struct {
	Leader     bool    // this Room holds the room's lease
	Before     int64   // served before the step
	Served     int64   // served after it
	Joined     int64   // join numbers given
	Rate       float64 // admissions per second written
	Avail      int64   // the stock seen (when AvailKnown)
	AvailKnown bool
	Conv       float64
	StockErr   error // the Remaining callback's error, if any (admissions held)
}

type sample struct {
	at     time.Time
	served int64
	avail  int64
	known  bool
}

type controller struct {
	mu      sync.Mutex // one step at a time
	conv    float64
	samples []sample
}

type controllers struct {
	mu sync.Mutex
	m  map[string]*controller
}

func (c *controllers) get(sku string) (*controller, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	x, ok := c.m[sku]
	return x, ok
}

func (c *controllers) set(sku string, x *controller) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[sku] = x
}

func (c *controllers) drop(sku string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, sku)
}

func (c *controllers) held() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.m))
	for k := range c.m {
		out = append(out, k)
	}
	return out
}

// Rate is the controller's curve: min(capacity, max(avail/(conv*ttl),
// MinRate)), 0 when the stock is unknown or gone. capacity is admissions
// per second, conv in (0,1] the share of admitted buyers who buy.
func Rate(capacity float64, avail int64, known bool, conv float64, ttl time.Duration) float64 {
	if !known || avail <= 0 || capacity <= 0 {
		return 0
	}
	conv = min(max(conv, convMin), 1)
	return min(capacity, max(float64(avail)/(conv*ttl.Seconds()), MinRate))
}

// MinRate is the floor of the rate while stock is left: the last few
// units would otherwise be offered one buyer every few seconds, and with
// admitted buyers who never come back the tail of a sale drains slowly
// while people wait. Admitting a little more than the units left costs
// nothing but a sold_out answer to a few: the gate decides.
const MinRate = 1.0

// Tick runs one controller step for s's room at now: take or renew the
// lease and, if held, read the stock, compute the rate and advance served
// by rate times the time since the last step (at most two ticks' worth).
// Tests drive it with their own clock; Run calls it every Config.Tick.
func (r *Room) Tick(ctx context.Context, s Settings, now time.Time) (Tick, error) {
	k := r.keysOf(s.SKU)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	v, err := leaseScript.Exec(cctx, r.c, []string{k.lease, k.state},
		[]string{r.cfg.Owner, ms64(r.cfg.LeaseTTL)}).ToArray()
	cancel()
	if err != nil {
		return Tick{}, r.unavailable(ctx, err)
	}
	held, _ := v[0].AsInt64()
	if held != 1 {
		r.ctl.drop(s.SKU)
		return Tick{}, nil
	}
	c, ok := r.ctl.get(s.SKU)
	if !ok {
		c = &controller{conv: 1}
		if cs, err := v[1].ToString(); err == nil {
			if x, err := strconv.ParseFloat(cs, 64); err == nil && x > 0 {
				c.conv = x
			}
		}
		r.ctl.set(s.SKU, c)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	t := Tick{Leader: true}
	sctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	t.Avail, t.AvailKnown, t.StockErr = r.remaining(sctx, s.SKU)
	cancel()
	if t.StockErr != nil {
		t.AvailKnown = false
	}
	c.measure(now, t.Avail, t.AvailKnown, r.cfg.AdmissionTTL)
	t.Conv = c.conv
	capacity := s.Rate
	if capacity <= 0 {
		capacity = r.cfg.DefaultRate
	}
	t.Rate = Rate(capacity, t.Avail, t.AvailKnown, c.conv, r.cfg.Horizon)
	avail := ""
	if t.AvailKnown {
		avail = strconv.FormatInt(t.Avail, 10)
	}

	cctx, cancel = context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	v, err = tickScript.Exec(cctx, r.c, []string{k.state, k.lease}, []string{
		r.cfg.Owner, ms(now), ms(s.OpensAt), strconv.FormatFloat(t.Rate, 'g', -1, 64), avail,
		strconv.FormatFloat(c.conv, 'g', -1, 64), newLotteryKeys().String(),
		ms64(2 * r.cfg.Tick), strconv.FormatInt(int64(r.cfg.KeyTTL/time.Second), 10),
	}).ToArray()
	if err != nil {
		return Tick{}, r.unavailable(ctx, err)
	}
	if t.Before, err = v[0].AsInt64(); err != nil {
		return Tick{}, fmt.Errorf("%w: tick.lua: %v", ErrUnavailable, err)
	}
	if t.Before < 0 { // the lease expired between the two calls
		r.ctl.drop(s.SKU)
		return Tick{}, nil
	}
	if len(v) != 3 {
		return Tick{}, fmt.Errorf("%w: tick.lua returned %d values", ErrUnavailable, len(v))
	}
	t.Served, _ = v[1].AsInt64()
	t.Joined, _ = v[2].AsInt64()
	c.samples = append(c.samples, sample{at: now, served: t.Served, avail: t.Avail, known: t.AvailKnown})
	if n := t.Served - t.Before; n > 0 {
		r.obs.Admitted(s.SKU, n)
	}
	return t, nil
}

// measure updates conv from the samples of the last window: units sold
// (each drop of the stock between two known samples, the current stock
// included; units coming back are not sales) over positions served.
func (c *controller) measure(now time.Time, avail int64, known bool, window time.Duration) {
	i := 0
	for i < len(c.samples)-1 && now.Sub(c.samples[i].at) > window {
		i++
	}
	c.samples = c.samples[i:]
	if len(c.samples) == 0 {
		return
	}
	admitted := c.samples[len(c.samples)-1].served - c.samples[0].served
	if admitted < convSample {
		return
	}
	var sold int64
	prev := c.samples[0]
	for i := 1; i <= len(c.samples); i++ {
		s := sample{avail: avail, known: known}
		if i < len(c.samples) {
			s = c.samples[i]
		}
		if prev.known && s.known && s.avail < prev.avail {
			sold += prev.avail - s.avail
		}
		if s.known {
			prev = s
		}
	}
	conv := float64(sold) / float64(admitted)
	if math.IsNaN(conv) {
		return
	}
	c.conv = min(max(conv, convMin), 1)
}

// RunOnce runs Tick for every room at now and returns the first error.
func (r *Room) RunOnce(ctx context.Context, rooms []Settings, now time.Time) error {
	var first error
	for _, s := range rooms {
		if _, err := r.Tick(ctx, s, now); err != nil && first == nil {
			first = fmt.Errorf("room %s: %w", s.SKU, err)
		}
	}
	return first
}

// Run is the controller loop: every Config.Tick it runs RunOnce on the rooms
// rooms() returns (the SKUs that have a waiting room), until ctx ends; then
// it gives up the leases it holds so another instance takes over at once.
// Errors (Redis unreachable) are retried on the next tick.
func (r *Room) Run(ctx context.Context, rooms func() []Settings) {
	tk := time.NewTicker(r.cfg.Tick)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			r.releaseAll()
			return
		case <-tk.C:
		}
		list := rooms()
		live := make(map[string]bool, len(list))
		for _, s := range list {
			live[s.SKU] = true
		}
		for _, sku := range r.ctl.held() {
			if !live[sku] {
				r.release(context.Background(), sku)
			}
		}
		_ = r.RunOnce(ctx, list, r.cfg.Now())
	}
}

func (r *Room) releaseAll() {
	for _, sku := range r.ctl.held() {
		r.release(context.Background(), sku)
	}
}

// release gives sku's lease up if this Room holds it.
func (r *Room) release(ctx context.Context, sku string) {
	r.ctl.drop(sku)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	// Best effort: a lease not released expires after LeaseTTL.
	_ = releaseScript.Exec(cctx, r.c, []string{r.keysOf(sku).lease}, []string{r.cfg.Owner}).Error()
}
