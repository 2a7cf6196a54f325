package risk

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)

func entry(id int64, kind, value string, expires time.Time) Entry {
	return Entry{ID: id, Kind: kind, Value: value, Reason: "test", Source: "admin", Actor: "admin", CreatedAt: t0, ExpiresAt: expires}
}

// TestBlocked: buyers by id, addresses exactly and by prefix (IPv4, IPv6,
// IPv4-mapped IPv6 as IPv4), longest prefix first, and an expired entry
// never blocks.
func TestBlocked(t *testing.T) {
	var l List
	l.Replace([]Entry{
		entry(1, "buyer", "mallory", time.Time{}),
		entry(2, "buyer", "brief", t0.Add(time.Minute)),
		entry(3, "ip", "192.0.2.7", time.Time{}),
		entry(4, "ip", "198.51.100.0/24", time.Time{}),
		entry(5, "ip", "10.0.0.0/8", time.Time{}),
		entry(6, "ip", "10.1.0.0/16", t0.Add(time.Minute)), // longer, expiring
		entry(7, "ip", "2001:db8::/32", time.Time{}),
		entry(8, "ip", "2001:db8:ffff::1", time.Time{}),
		entry(9, "ip", "2001:db9:1::/48", t0.Add(-time.Second)), // expired
		entry(10, "ip", "203.0.113.0/24", t0.Add(time.Minute)),
		entry(11, "ip", "203.0.113.0/24", time.Time{}), // the same prefix without expiry: kept
		entry(12, "ip", "not an address", time.Time{}), // skipped
		entry(13, "nonsense", "x", time.Time{}),        // skipped
	})
	if l.Len() != 11 {
		t.Errorf("Len = %d, want 11", l.Len())
	}
	tests := []struct {
		user, ip string
		at       time.Time
		want     int64 // the blocking entry, 0: none
	}{
		{"mallory", "", t0, 1},
		{"mallory", "192.0.2.7", t0, 1}, // the buyer's entry first
		{"alice", "", t0, 0},
		{"brief", "", t0, 2},
		{"brief", "", t0.Add(time.Minute), 0}, // expiry is exclusive
		{"", "192.0.2.7", t0, 3},
		{"alice", "192.0.2.8", t0, 0},
		{"alice", "::ffff:192.0.2.7", t0, 3},
		{"alice", "198.51.100.255", t0, 4},
		{"alice", "::ffff:198.51.100.1", t0, 4},
		{"alice", "198.51.101.1", t0, 0},
		{"alice", "10.1.2.3", t0, 6},
		{"alice", "10.1.2.3", t0.Add(time.Hour), 5}, // the /16 expired, the /8 holds
		{"alice", "10.2.2.3", t0, 5},
		{"alice", "11.0.0.1", t0, 0},
		{"alice", "2001:db8:1234::5", t0, 7},
		{"alice", "2001:db8:ffff::1", t0, 8},
		{"alice", "fe80::1%eth0", t0, 0},
		{"alice", "2001:db9:1::1", t0, 0}, // expired before now
		{"alice", "2001:db7::1", t0, 0},
		{"alice", "203.0.113.9", t0.Add(time.Hour), 11},
	}
	for _, tt := range tests {
		var ip netip.Addr
		if tt.ip != "" {
			ip = netip.MustParseAddr(tt.ip)
		}
		e, ok := l.Blocked(tt.user, ip, tt.at)
		if ok != (tt.want != 0) || e.ID != tt.want {
			t.Errorf("Blocked(%q, %s, %s) = %d %v, want %d", tt.user, tt.ip, tt.at.Sub(t0), e.ID, ok, tt.want)
		}
	}
	var empty List
	if _, ok := empty.Blocked("mallory", netip.MustParseAddr("192.0.2.7"), t0); ok || empty.Len() != 0 {
		t.Error("the zero List blocks")
	}
}

// TestIPv6PrefixOfMappedAddress: a list of IPv4 prefixes holds for IPv4
// clients whatever form their address arrives in, and an IPv6 prefix never
// matches an IPv4 address.
func TestIPv6PrefixOfMappedAddress(t *testing.T) {
	var l List
	l.Replace([]Entry{entry(1, "ip", "::/0", time.Time{})})
	if _, ok := l.Blocked("", netip.MustParseAddr("::ffff:192.0.2.1"), t0); ok {
		t.Error("::/0 blocks an IPv4-mapped address")
	}
	if _, ok := l.Blocked("", netip.MustParseAddr("2001:db8::1"), t0); !ok {
		t.Error("::/0 does not block an IPv6 address")
	}
	l.Replace([]Entry{entry(2, "ip", "0.0.0.0/0", time.Time{})})
	if _, ok := l.Blocked("", netip.MustParseAddr("::ffff:192.0.2.1"), t0); !ok {
		t.Error("0.0.0.0/0 does not block an IPv4-mapped address")
	}
}

// TestReplaceWhileReading: readers on many goroutines see one whole
// snapshot or the next, never a mix, while Replace swaps (run with -race).
func TestReplaceWhileReading(t *testing.T) {
	var l List
	gen := func(g int) []Entry {
		es := make([]Entry, 0, 100)
		for i := range 50 {
			es = append(es, entry(int64(g*1000+i), "buyer", fmt.Sprintf("g%d-u%d", g, i), time.Time{}))
			es = append(es, entry(int64(g*1000+500+i), "ip", fmt.Sprintf("10.%d.%d.0/24", g%256, i), time.Time{}))
		}
		return es
	}
	l.Replace(gen(0))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for r := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Whatever generation is in, its buyers and its ranges
				// are all there: the entry found for g<N>-u<i> is of
				// generation N, and so is the range of that generation.
				e, ok := l.Blocked("", netip.AddrFrom4([4]byte{10, 0, byte(i % 50), 1}), t0)
				if ok && e.ID%1000 < 500 {
					errs <- fmt.Sprintf("reader %d: address matched buyer entry %d", r, e.ID)
					return
				}
				if n := l.Len(); n != 100 {
					errs <- fmt.Sprintf("reader %d: Len %d", r, n)
					return
				}
			}
		})
	}
	for g := 1; g <= 60; g++ {
		l.Replace(gen(g))
	}
	close(stop)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if _, ok := l.Blocked("g60-u7", netip.Addr{}, t0); !ok {
		t.Error("the last generation is not in")
	}
	if _, ok := l.Blocked("g59-u7", netip.Addr{}, t0); ok {
		t.Error("an earlier generation is still in")
	}
}

// BenchmarkBlocked: the check a buyer route makes per request, on lists of
// 10,000 buyers, 10,000 addresses and 1,000 prefixes of 3 lengths.
func BenchmarkBlocked(b *testing.B) {
	var es []Entry
	for i := range 10000 {
		es = append(es, entry(int64(i+1), "buyer", fmt.Sprintf("u%d", i), time.Time{}))
		es = append(es, entry(int64(20000+i), "ip", netip.AddrFrom4([4]byte{100, byte(i >> 8), byte(i), 1}).String(), time.Time{}))
	}
	for i := range 1000 {
		es = append(es, entry(int64(40000+i), "ip", fmt.Sprintf("172.%d.%d.0/%d", i%16, i/16, []int{24, 20, 16}[i%3]), time.Time{}))
	}
	var l List
	l.Replace(es)
	ip := netip.MustParseAddr("198.51.100.20")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := l.Blocked("alice", ip, t0); ok {
			b.Fatal("blocked")
		}
	}
}
