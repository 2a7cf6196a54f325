// Package risk holds the risk lists (blocked buyers and IP ranges) in every instance's memory, keeps them in step with the database of record, and lists identities that keep failing proofs or resending spent solutions automatically.
//
// Files: list.go (List, the in-memory lists and the check a buyer route
// makes), syncer.go (Syncer: reloads the lists on a change notice and every
// second), notice.go (the change notice over core NATS), admin.go (Admin:
// the admin API's changes, announced), strikes.go and strike.lua (Strikes:
// failures per buyer in Redis, and the automatic entries). docs/risk.md
// describes the lists, the API and the choice of 403 blocked.
package risk

import (
	"cmp"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
)

// Entry is one entry of the risk lists (orderstore.RiskEntry).
type Entry = orderstore.RiskEntry

// List is the risk lists of one instance, in memory. Blocked reads an
// immutable snapshot without locks; Replace builds a new snapshot and swaps
// it in with one atomic pointer store, so readers never see a half-built
// list. The zero List is empty and usable, and a nil *List blocks nobody;
// it is safe for concurrent use.
type List struct {
	p atomic.Pointer[snapshot]
}

// snapshot is one immutable version of the lists.
type snapshot struct {
	buyers map[string]Entry
	// addrs holds the entries of single addresses (IPv4-mapped IPv6 as
	// IPv4), prefixes the others by masked prefix.
	addrs    map[netip.Addr]Entry
	prefixes map[netip.Prefix]Entry
	// bits4 and bits6 are the distinct lengths of the prefixes of each
	// family, longest first: an address is looked up once per length.
	bits4, bits6 []int
	n            int
}

// Replace makes es the lists. Entries whose value does not parse (which
// the store never returns) are skipped. Of several entries for one value
// the one that blocks longest is kept (no expiry beats any expiry): if it
// has expired, so have the others.
func (l *List) Replace(es []Entry) {
	s := &snapshot{buyers: map[string]Entry{}, addrs: map[netip.Addr]Entry{}, prefixes: map[netip.Prefix]Entry{}}
	seen4, seen6 := map[int]bool{}, map[int]bool{}
	for _, e := range es {
		switch e.Kind {
		case orderstore.RiskBuyer:
			if e.Value == "" {
				continue
			}
			s.buyers[e.Value] = longer(s.buyers[e.Value], e)
		case orderstore.RiskIP:
			p, err := orderstore.ParseRiskPrefix(e.Value)
			if err != nil {
				continue
			}
			if p.IsSingleIP() {
				s.addrs[p.Addr()] = longer(s.addrs[p.Addr()], e)
				break
			}
			s.prefixes[p] = longer(s.prefixes[p], e)
			if p.Addr().Is4() {
				seen4[p.Bits()] = true
			} else {
				seen6[p.Bits()] = true
			}
		default:
			continue
		}
		s.n++
	}
	s.bits4, s.bits6 = lengths(seen4), lengths(seen6)
	l.p.Store(s)
}

// longer returns whichever of a (possibly zero: none) and b blocks longer.
func longer(a, b Entry) Entry {
	switch {
	case a.ID == 0:
		return b
	case a.ExpiresAt.IsZero():
		return a
	case b.ExpiresAt.IsZero() || b.ExpiresAt.After(a.ExpiresAt):
		return b
	}
	return a
}

func lengths(seen map[int]bool) []int {
	out := make([]int, 0, len(seen))
	for b := range seen {
		out = append(out, b)
	}
	slices.SortFunc(out, func(x, y int) int { return cmp.Compare(y, x) })
	return out
}

// Len returns the number of entries held (expired ones included until the
// next reload).
func (l *List) Len() int {
	if l == nil {
		return 0
	}
	if s := l.p.Load(); s != nil {
		return s.n
	}
	return 0
}

// Blocked reports whether user, or the address ip, is on the lists at now,
// and the entry that blocks (for a buyer and an address both listed, the
// buyer's). An entry whose expiry is not after now never blocks, reloaded
// or not. user "" checks no buyer, an invalid ip (the zero Addr) no
// address; ip may be IPv4, IPv6 or IPv4-mapped IPv6 (checked as IPv4), its
// zone is ignored.
//
// The cost: a buyer is one map look-up. An address is one look-up among
// the single addresses, then one per distinct prefix length present in its
// family (a list of /24s and /16s: two), each a map look-up of the address
// masked to that length; no scan of the entries, and no allocation.
func (l *List) Blocked(user string, ip netip.Addr, now time.Time) (Entry, bool) {
	if l == nil {
		return Entry{}, false
	}
	s := l.p.Load()
	if s == nil {
		return Entry{}, false
	}
	if user != "" {
		if e, ok := s.buyers[user]; ok && e.Live(now) {
			return e, true
		}
	}
	if !ip.IsValid() {
		return Entry{}, false
	}
	ip = ip.Unmap().WithZone("")
	if e, ok := s.addrs[ip]; ok && e.Live(now) {
		return e, true
	}
	bits := s.bits6
	if ip.Is4() {
		bits = s.bits4
	}
	for _, b := range bits {
		p, err := ip.Prefix(b)
		if err != nil {
			continue
		}
		if e, ok := s.prefixes[p]; ok && e.Live(now) {
			return e, true
		}
	}
	return Entry{}, false
}
