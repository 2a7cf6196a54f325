package purchase

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// Limits are the protections of the purchase path in front of the Redis
// gate. The zero value turns them all off.
type Limits struct {
	// SKU, User and IP are the distributed rate limits, evaluated by the
	// gate's script in the same call as the stock (per SKU; per user and
	// per client IP on each SKU). A zero PerSecond disables one. IPv6
	// clients are limited per /64, the block one subscriber usually holds.
	SKU, User, IP stockgate.Rate
	// SoldOutTTL is how long a SKU the gate reported sold out is answered
	// sold out from memory before one request is let through to ask again
	// (so units given back by a release or compensation are sold again
	// within about SoldOutTTL even if no change notice arrives). Notices of
	// restocks, warm-ups and releases clear it at once. 0 disables the flag.
	SoldOutTTL time.Duration
	// SoldOutLease, when positive (and SoldOutTTL too), answers a keyed
	// purchase of a flagged SKU sold out from a snapshot of the sale's key
	// holders read under a sold-out lease of this length, instead of asking
	// Redis whether the key made an order, while Service.SetSoldLeases says
	// every instance runs scripts that honour the lease (soldlease.go).
	SoldOutLease time.Duration
	// SoldOutLeaseKeys caps a snapshot's key holders (0:
	// DefaultSoldOutLeaseKeys): a larger sale keeps asking Redis.
	SoldOutLeaseKeys int
}

func (l Limits) gate(ipKey string) stockgate.Limits {
	return stockgate.Limits{SKU: l.SKU, User: l.User, IP: l.IP, IPKey: ipKey}
}

// IPKey returns the key the IP limit counts a client address under: the
// address itself for IPv4 (IPv4-mapped IPv6 included), its /64 for IPv6;
// "" when ip is not an address (the IP limit is then skipped).
func IPKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ""
	}
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return a.String()
	}
	p, err := a.Prefix(64)
	if err != nil {
		return ""
	}
	return p.String()
}

// blocklist remembers, per limit key, until when the gate said a limit
// refuses, so that a client hammering a limit is answered from memory
// instead of costing a Redis call per request. The gate's GCRA only moves
// its arrival time forward, so an answer from here is the one the gate
// would give. Entries expire with their wait; the map is bounded.
type blocklist struct {
	mu        sync.Mutex
	m         map[string]int64 // key -> unix ns until which the limit refuses
	nextSweep int64
}

const (
	blocklistMax   = 1 << 20
	blocklistSweep = int64(time.Second)
)

// wait returns how long key is still refused (0: not known to be refused).
func (b *blocklist) wait(key string, now time.Time) time.Duration {
	return b.waitBytes([]byte(key), now)
}

// waitBytes is wait of a key composed in a buffer (the look-up copies nothing).
func (b *blocklist) waitBytes(key []byte, now time.Time) time.Duration {
	b.mu.Lock()
	until, ok := b.m[string(key)]
	b.mu.Unlock()
	if !ok {
		return 0
	}
	return max(time.Duration(until-now.UnixNano()), 0)
}

// add records that key is refused for d from now.
func (b *blocklist) add(key string, d time.Duration, now time.Time) {
	if d <= 0 {
		return
	}
	n := now.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]int64{}
	}
	if n >= b.nextSweep || len(b.m) >= blocklistMax {
		for k, until := range b.m {
			if until <= n {
				delete(b.m, k)
			}
		}
		b.nextSweep = n + blocklistSweep
	}
	if len(b.m) < blocklistMax {
		b.m[key] = n + int64(d)
	}
}

// limitKeys are the blocklist keys of a purchase, by scope (SKU, user, IP).
func limitKeys(sku, user, ipKey string) [3]string {
	return [3]string{"s\x00" + sku, "u\x00" + sku + "\x00" + user, "i\x00" + sku + "\x00" + ipKey}
}

// appendLimitKey appends the limitKeys key of scope i to dst.
func appendLimitKey(dst []byte, i int, sku, user, ipKey string) []byte {
	switch i {
	case 0:
		return append(append(dst, "s\x00"...), sku...)
	case 1:
		return append(append(append(append(dst, "u\x00"...), sku...), 0), user...)
	}
	return append(append(append(append(dst, "i\x00"...), sku...), 0), ipKey...)
}

var limitScopes = [3]string{"sku", "user", "ip"}

// blocked returns the error of a limit this instance knows still refuses
// the purchase, or nil. The keys are composed on the stack: a purchase no
// limit refuses allocates nothing here.
func (s *Service) blocked(sku, user, ipKey string, now time.Time) error {
	on := [3]bool{s.limits.SKU.On(), s.limits.User.On(), s.limits.IP.On() && ipKey != ""}
	var buf [256]byte
	for i := range on {
		if !on[i] {
			continue
		}
		if d := s.block.waitBytes(appendLimitKey(buf[:0], i, sku, user, ipKey), now); d > 0 {
			return &sale.RateLimitError{Scope: limitScopes[i], RetryAfter: d}
		}
	}
	return nil
}

// remember records the waits of a gate's rate limit refusal.
func (s *Service) remember(keys [3]string, le *stockgate.LimitedError, now time.Time) {
	for i, d := range [3]time.Duration{le.SKU, le.User, le.IP} {
		s.block.add(keys[i], d, now)
	}
}

// soldOutFlags answer purchases of SKUs the gate reported sold out from
// memory. A flag holds the units the gate last reported left (a purchase of
// at most that many still goes to the gate) and expires after its TTL: then
// exactly one request goes to the gate to ask again (the others are still
// answered sold out until it has its answer). Clearing (on a notice that
// units came back) is immediate.
type soldOutFlags struct {
	ttl time.Duration
	m   sync.Map // sku -> *soldOutFlag
	// gen counts clearings: a sold-out answer obtained before a clearing
	// must not set the flag again after it.
	gen atomic.Uint64
}

type soldOutFlag struct {
	avail atomic.Int64
	until atomic.Int64 // unix ns
}

// admit reports whether a purchase of qty units of sku may go to the gate.
func (f *soldOutFlags) admit(sku string, qty int64, now time.Time) bool {
	if f.ttl <= 0 {
		return true
	}
	v, ok := f.m.Load(sku)
	if !ok {
		return true
	}
	fl := v.(*soldOutFlag)
	if qty <= fl.avail.Load() {
		return true
	}
	until := fl.until.Load()
	if now.UnixNano() < until {
		return false
	}
	// Expired: the one caller that moves the deadline asks the gate.
	return fl.until.CompareAndSwap(until, now.Add(f.ttl).UnixNano())
}

// set records that the gate found only avail units of sku, unless a
// clearing happened since gen was read.
func (f *soldOutFlags) set(sku string, avail int64, now time.Time, gen uint64) {
	if f.ttl <= 0 || f.gen.Load() != gen {
		return
	}
	fl := &soldOutFlag{}
	fl.avail.Store(max(avail, 0))
	fl.until.Store(now.Add(f.ttl).UnixNano())
	f.m.Store(sku, fl)
}

// unset drops the flag of sku after the gate sold units of it (it had more
// than the flag said).
func (f *soldOutFlags) unset(sku string) {
	if _, ok := f.m.Load(sku); ok {
		f.m.Delete(sku)
	}
}

// clear drops the flag of sku (of every SKU when sku is empty): units came back.
func (f *soldOutFlags) clear(sku string) {
	f.gen.Add(1)
	if sku == "" {
		f.m.Clear()
		return
	}
	f.m.Delete(sku)
}

// SoldOutFlagged reports whether this instance currently answers sku sold
// out from memory (for tests and the operators' view).
func (s *Service) SoldOutFlagged(sku string) bool {
	v, ok := s.soldOut.m.Load(sku)
	return ok && s.now().UnixNano() < v.(*soldOutFlag).until.Load()
}
