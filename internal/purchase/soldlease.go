package purchase

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/internal/stockgate"
)

// A keyed purchase of a SKU this instance has flagged sold out must learn
// whether its Idempotency-Key made an order (a retry gets its order, never
// sold_out). With sold-out leases on (Limits.SoldOutLease, and every
// instance running scripts that honour them: SetSoldLeases), that is
// answered from a snapshot of the sale's key holders read with a lease in
// Redis during which no key is added to the sale (stockgate.TakeSoldLease;
// docs/architecture.md, "Answering keyed sold-out from memory"): a key not
// in the snapshot made no order. A key in it, or a sale without a usable
// snapshot, asks Redis as before.

// SoldLeaser is the gate's sold-out lease (stockgate.Gate).
type SoldLeaser interface {
	TakeSoldLease(ctx context.Context, sku string, ttl time.Duration, maxKeys int) (stockgate.SoldLease, error)
	RenewSoldLease(ctx context.Context, sku string, ttl time.Duration, l stockgate.SoldLease) (stockgate.SoldLease, error)
}

// DefaultSoldOutLeaseKeys is the most key holders a sale's snapshot may
// hold (Limits.SoldOutLeaseKeys when 0): a larger sale keeps the look-up.
const DefaultSoldOutLeaseKeys = 200_000

// soldLeaseCallTimeout bounds one lease call: a call that runs out of its
// deadline breaks the Redis connection it shares with others, so it is
// generous; a snapshot is used only until its own deadline anyway.
const soldLeaseCallTimeout = 2 * time.Second

type soldLeases struct {
	ttl  time.Duration // 0: off
	max  int
	g    SoldLeaser // nil: off
	log  *slog.Logger
	on   atomic.Bool // the fleet allows them (SetSoldLeases)
	m    sync.Map    // sku -> *soldSKU
	used atomic.Int64
}

// keyPair is one key holder, as a map key that a look-up builds without
// allocating.
type keyPair struct{ user, key string }

// snapshot is a sale's key holders under a lease held until until (this
// process's monotonic clock). Never changed once published.
type snapshot struct {
	keys  map[keyPair]struct{}
	until time.Time
	lease stockgate.SoldLease // Keys dropped
}

// soldSKU is one sale's snapshot and the goroutine that keeps it.
type soldSKU struct {
	cur  atomic.Pointer[snapshot]
	used atomic.Int64 // unix ns of the last look-up
}

// absent reports whether user's key made no order on sku according to a
// live snapshot. false means "ask Redis": no snapshot (one is being taken),
// its lease ended, or the key holds an order.
func (l *soldLeases) absent(sku, user, key string, now time.Time) bool {
	if l.g == nil || l.ttl <= 0 || !l.on.Load() {
		return false
	}
	v, ok := l.m.Load(sku)
	if !ok {
		s := &soldSKU{}
		s.used.Store(now.UnixNano())
		if _, loaded := l.m.LoadOrStore(sku, s); !loaded {
			go l.keep(sku, s)
		}
		return false
	}
	s := v.(*soldSKU)
	s.used.Store(now.UnixNano())
	snap := s.cur.Load()
	if snap == nil || !time.Now().Before(snap.until) {
		return false
	}
	_, held := snap.keys[keyPair{user, key}]
	if !held {
		l.used.Add(1)
	}
	return !held
}

// unreplicatedBackoff is how long a keeper waits after a lease no replica
// acknowledged before it takes one again.
const unreplicatedBackoff = 10 * time.Second

// keep takes sku's lease and renews it every third of its length while the
// sale is asked about, and forgets it after two lease lengths unasked.
func (l *soldLeases) keep(sku string, s *soldSKU) {
	defer l.m.CompareAndDelete(sku, s)
	every := l.ttl / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for ; ; <-t.C {
		if !l.on.Load() || time.Since(time.Unix(0, s.used.Load())) > 2*l.ttl {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), soldLeaseCallTimeout)
		cur := s.cur.Load()
		if cur != nil && !time.Now().Before(cur.until) {
			// Its lease may have lapsed: a renewal is refused then (a
			// take after the lapse changed the version), but a snapshot
			// past its deadline is never renewed.
			s.cur.CompareAndSwap(cur, nil)
			cur = nil
		}
		var got stockgate.SoldLease
		var err error
		if cur != nil {
			got, err = l.g.RenewSoldLease(ctx, sku, l.ttl, cur.lease)
		} else {
			got, err = l.g.TakeSoldLease(ctx, sku, l.ttl, l.max)
		}
		cancel()
		switch {
		case err != nil:
			l.log.Debug("purchase: sold-out lease", "sku_id", sku, "err", err)
			s.cur.Store(nil)
		case !got.Granted:
			s.cur.Store(nil)
			if got.Reason == "unreplicated" {
				// The key holders were read, then not used: not again
				// every third of a lease (a large sale's read holds Redis).
				for end := time.Now().Add(unreplicatedBackoff); time.Now().Before(end) && l.on.Load(); {
					<-t.C
				}
			}
		case cur != nil:
			s.cur.Store(&snapshot{keys: cur.keys, until: got.Until, lease: got})
		default:
			keys := make(map[keyPair]struct{}, len(got.Keys))
			for _, f := range got.Keys {
				u, k, _ := strings.Cut(f, "\x00")
				keys[keyPair{u, k}] = struct{}{}
			}
			got.Keys = nil
			s.cur.Store(&snapshot{keys: keys, until: got.Until, lease: got})
		}
	}
}

// drop forgets sku's snapshot (every SKU's when sku is empty): units came
// back, or the fleet turned leases off. A later look-up takes a new one.
func (l *soldLeases) drop(sku string) {
	if sku == "" {
		l.m.Range(func(_, v any) bool { v.(*soldSKU).cur.Store(nil); return true })
		return
	}
	if v, ok := l.m.Load(sku); ok {
		v.(*soldSKU).cur.Store(nil)
	}
}

// SetSoldLeases turns the use of sold-out leases on or off (serve turns
// them on while every instance of the fleet runs scripts that honour them,
// and Limits.SoldOutLease is set).
func (s *Service) SetSoldLeases(on bool) {
	if s.leases.on.Swap(on) && !on {
		s.leases.drop("")
	}
}

// SoldLeaseInUse returns the sold-out lease this instance answers from
// now (0: leases off).
func (s *Service) SoldLeaseInUse() time.Duration {
	if s.leases.g == nil || !s.leases.on.Load() {
		return 0
	}
	return s.leases.ttl
}

// SoldOutFromLease returns how many keyed sold-out answers this instance
// gave from a lease's snapshot (without asking Redis).
func (s *Service) SoldOutFromLease() int64 { return s.leases.used.Load() }

// SoldLeased reports whether this instance holds a live snapshot of sku's
// key holders (for tests and the operators' view).
func (s *Service) SoldLeased(sku string) bool {
	v, ok := s.leases.m.Load(sku)
	if !ok {
		return false
	}
	snap := v.(*soldSKU).cur.Load()
	return snap != nil && time.Now().Before(snap.until)
}
