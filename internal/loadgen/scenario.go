package loadgen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Scenario names.
const (
	// Hot: one SKU, far more buyers than units, duplicate clicks.
	Hot = "hot"
	// Many: buyers spread over many SKUs.
	Many = "many"
	// Storm: the SKU is sold out before the measured run: every buyer is refused.
	Storm = "storm"
	// Mix: buyers, and owners paying or cancelling their orders.
	Mix = "mix"
	// Purchase: one SKU, every request a new buyer's first click: with
	// stock for every request, each one takes a unit (the purchase path).
	Purchase = "purchase"
	// SoldOut: one SKU sold out before the measured run, every request a
	// new buyer's first click: each one is refused (the sold-out path).
	SoldOut = "sold-out"
)

// Scenarios lists the scenario names.
func Scenarios() []string { return []string{Hot, Many, Storm, Mix, Purchase, SoldOut} }

// PathCode returns the answer the scenario's every request should get
// ("accepted" for Purchase, "sold_out" for SoldOut), or "" for a scenario
// of mixed answers.
func (s *Scenario) PathCode() string {
	switch s.cfg.Name {
	case Purchase:
		return "accepted"
	case SoldOut:
		return "sold_out"
	}
	return ""
}

// ScenarioConfig describes a scenario.
type ScenarioConfig struct {
	Name string
	// Stock is the units on sale: of the SKU, or in total over the SKUs of
	// Many (each gets Stock/SKUs, at least 1).
	Stock int64
	// SKUs is the number of SKUs of Many.
	SKUs int
	// PerUserLimit of every SKU (default 1).
	PerUserLimit int64
	// RunID makes SKU, user and key names unique to the run.
	RunID string
}

// Scenario is the buyers' behaviour, the sales it needs and what the
// service promised them (the accepted order ids, checked afterwards).
//
// The buyers' clicks are numbered by the generator's sequence: of every 7
// requests, 5 are first clicks of 5 new buyers (each with its own
// Idempotency-Key), the 6th is the first of those buyers clicking again
// with the same key (a double click: must get the same order, never a
// second one), the 7th is the second buyer trying a second purchase with a
// new key (limit_reached at a limit of 1). Mix replaces one request in 4
// with paying or cancelling (alternately) an order bought earlier.
// Purchase and SoldOut send only first clicks, each of a new buyer.
type Scenario struct {
	cfg  ScenarioConfig
	skus []string
	each int64 // stock per SKU

	mu       sync.Mutex
	accepted map[string]map[string]bool // sku -> order ids

	owned     chan ownedOrder // mix: orders waiting to be paid or cancelled
	settled   atomic.Int64
	Note      string // why part of the scenario did not run, if so
	lifecycle bool
}

type ownedOrder struct{ user, id string }

// NewScenario validates cfg and names the scenario's sales.
func NewScenario(cfg ScenarioConfig) (*Scenario, error) {
	if cfg.PerUserLimit == 0 {
		cfg.PerUserLimit = 1
	}
	switch {
	case !slices.Contains(Scenarios(), cfg.Name):
		return nil, fmt.Errorf("unknown scenario %q (one of %v)", cfg.Name, Scenarios())
	case cfg.Stock < 1:
		return nil, errors.New("stock must be at least 1")
	case cfg.PerUserLimit < 1:
		return nil, errors.New("per-user limit must be at least 1")
	case cfg.RunID == "":
		return nil, errors.New("a run id is required")
	}
	s := &Scenario{cfg: cfg, each: cfg.Stock, accepted: map[string]map[string]bool{}, owned: make(chan ownedOrder, 1<<16)}
	n := 1
	if cfg.Name == Many {
		if cfg.SKUs < 1 {
			return nil, errors.New("scenario many needs at least 1 SKU")
		}
		n = cfg.SKUs
		s.each = max(cfg.Stock/int64(n), 1)
	}
	for i := 0; i < n; i++ {
		s.skus = append(s.skus, fmt.Sprintf("%s-%s-%d", cfg.Name, cfg.RunID, i))
	}
	return s, nil
}

// SKUs returns the scenario's SKU ids.
func (s *Scenario) SKUs() []string { return s.skus }

// StockPerSKU returns the units each SKU is created with.
func (s *Scenario) StockPerSKU() int64 { return s.each }

// Setup creates the sales through the admin API; Storm then sells the SKU
// out (those orders are recorded as accepted too); Mix checks that the
// service has the pay and cancel routes and notes it if not (the scenario
// then only buys).
func (s *Scenario) Setup(ctx context.Context, c *Client) error {
	for _, sku := range s.skus {
		if err := c.PutSKU(ctx, sku, s.each, s.cfg.PerUserLimit); err != nil {
			return err
		}
	}
	switch s.cfg.Name {
	case Storm, SoldOut:
		return s.sellOut(ctx, c, s.skus[0])
	case Mix:
		ok, err := c.HasLifecycle(ctx)
		if err != nil {
			return err
		}
		s.lifecycle = ok
		if !ok {
			s.Note = "mix: the service has no POST /api/v1/orders/{id}/pay and /cancel routes (order lifecycle not built yet); buyers only bought"
		}
	}
	return nil
}

// sellOut buys sku until it answers sold_out, 32 buyers at a time.
func (s *Scenario) sellOut(ctx context.Context, c *Client, sku string) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 32)
	for w := 0; w < 32; w++ {
		wg.Go(func() {
			for tries := 0; ctx.Err() == nil; {
				i := next.Add(1)
				user := "pre-" + s.cfg.RunID + "-" + strconv.FormatInt(i, 10)
				r := c.Buy(ctx, user, sku, 1, "pre")
				switch {
				case r.Status == 202:
					s.accept(sku, r.OrderID)
				case r.Code == "sold_out":
					return
				case r.Code == "limit_reached":
				default:
					if tries++; tries > 100 {
						errc <- fmt.Errorf("selling out %s: HTTP %d %s %v", sku, r.Status, r.Code, r.Err)
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	return errors.Join(<-errc, ctx.Err())
}

func (s *Scenario) accept(sku, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.accepted[sku]
	if m == nil {
		m = map[string]bool{}
		s.accepted[sku] = m
	}
	m[id] = true
}

// Config returns the scenario's configuration (a worker's part is built
// from it, worker.go).
func (s *Scenario) Config() ScenarioConfig { return s.cfg }

// Lifecycle reports whether Setup found the pay and cancel routes (Mix).
func (s *Scenario) Lifecycle() bool { return s.lifecycle }

// AddAccepted records order ids accepted by SKU elsewhere (by workers).
func (s *Scenario) AddAccepted(bySKU map[string][]string) {
	for sku, ids := range bySKU {
		for _, id := range ids {
			s.accept(sku, id)
		}
	}
}

// Accepted returns, per SKU, the distinct order ids the service accepted (202).
func (s *Scenario) Accepted() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]string, len(s.skus))
	for _, sku := range s.skus {
		ids := make([]string, 0, len(s.accepted[sku]))
		for id := range s.accepted[sku] {
			ids = append(ids, id)
		}
		out[sku] = ids
	}
	return out
}

// Op returns the scenario's request number seq, sent through c.
func (s *Scenario) Op(c *Client) Op {
	return func(ctx context.Context, seq int64) Outcome {
		if s.cfg.Name == Mix && s.lifecycle && seq%4 == 3 {
			select {
			case o := <-s.owned:
				return s.settle(ctx, c, o)
			default: // nothing bought yet: buy instead
			}
		}
		g, pos := seq/7, seq%7
		buyer, key := 5*g+pos, "k1"
		switch {
		case s.cfg.Name == Purchase || s.cfg.Name == SoldOut:
			buyer = seq // every request a new buyer
		case pos == 5:
			buyer = 5 * g
		case pos == 6:
			buyer, key = 5*g+1, "k2"
		}
		user := "u-" + s.cfg.RunID + "-" + strconv.FormatInt(buyer, 10)
		sku := s.skus[buyer%int64(len(s.skus))]
		r := c.Buy(ctx, user, sku, 1, key)
		if r.Status == 202 && r.OrderID != "" {
			s.accept(sku, r.OrderID)
			if s.cfg.Name == Mix && s.lifecycle && pos != 5 {
				select {
				case s.owned <- ownedOrder{user, r.OrderID}:
				default:
				}
			}
		}
		return r.Outcome()
	}
}

// settle pays or cancels o (alternately); an order still queued goes back
// to be tried later.
func (s *Scenario) settle(ctx context.Context, c *Client, o ownedOrder) Outcome {
	var r Reply
	action := "pay"
	if s.settled.Add(1)%2 == 0 {
		action = "cancel"
		r = c.Cancel(ctx, o.user, o.id)
	} else {
		r = c.Pay(ctx, o.user, o.id)
	}
	if r.Code == "order_queued" {
		select {
		case s.owned <- o:
		default:
		}
	}
	out := r.Outcome()
	if out.Code != "paid" && out.Code != "cancelled" {
		out.Code = action + ":" + out.Code
	}
	return out
}
