package httpapi

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/stockgate"
)

func TestProtectionCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Protection
		want string // "" = accepted; else a part of the error
	}{
		{"zero", Protection{}, ""},
		{"defaults", Protection{InstanceRate: 20000, InstanceBurst: 20000, UserRate: 2, UserBurst: 5, SoldOutTTL: time.Second}, ""},
		{"negative rate", Protection{SKURate: -1}, "rate-limit-sku must be"},
		{"NaN rate", Protection{UserRate: math.NaN()}, "rate-limit-user must be"},
		{"infinite rate", Protection{IPRate: math.Inf(1)}, "rate-limit-ip must be"},
		{"rate too high", Protection{InstanceRate: 2e7}, "rate-limit-instance must be"},
		{"negative burst", Protection{IPBurst: -1}, "rate-limit-ip-burst must be"},
		{"negative sold-out ttl", Protection{SoldOutTTL: -time.Second}, "sold-out-ttl"},
		{"sold-out lease", Protection{SoldOutTTL: time.Second, SoldOutLease: time.Second}, ""},
		{"sold-out lease too short", Protection{SoldOutLease: 100 * time.Millisecond}, "sold-out-lease must be"},
		{"sold-out lease too long", Protection{SoldOutLease: time.Minute}, "sold-out-lease must be"},
		{"negative sold-out lease", Protection{SoldOutLease: -time.Second}, "sold-out-lease must be"},
		{"bad proxy", Protection{Proxies: "10.0.0.0/8, nope"}, "trusted proxies"},
		{"gateway without proxies", Protection{GatewayHeader: "X-User-Id"}, "needs trusted-proxies"},
		{"gateway", Protection{Proxies: "10.0.0.1", GatewayHeader: "X-User-Id"}, ""},
		{"gateway Authorization", Protection{Proxies: "10.0.0.1", GatewayHeader: "authorization"}, "not a usable header name"},
		{"gateway bad name", Protection{Proxies: "10.0.0.1", GatewayHeader: "X User"}, "not a usable header name"},
		{"gateway name too long", Protection{Proxies: "10.0.0.1", GatewayHeader: strings.Repeat("x", 65)}, "not a usable header name"},
	} {
		err := tc.p.Check()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want accepted", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.want)
		}
	}
}

// TestProtectionLimits: a rate of 0 turns a limit off, a burst of 0 is one
// second's worth (at least 1).
func TestProtectionLimits(t *testing.T) {
	p := Protection{SKURate: 100.5, UserRate: 2, UserBurst: 5, IPRate: 0.2, SoldOutTTL: time.Second}
	want := purchase.Limits{
		SKU:        stockgate.Rate{PerSecond: 100.5, Burst: 101},
		User:       stockgate.Rate{PerSecond: 2, Burst: 5},
		IP:         stockgate.Rate{PerSecond: 0.2, Burst: 1},
		SoldOutTTL: time.Second,
	}
	if diff := cmp.Diff(want, p.Limits()); diff != "" {
		t.Errorf("Limits (-want +got):\n%s", diff)
	}
	if got := (Protection{}).Limits(); got != (purchase.Limits{}) {
		t.Errorf("zero Protection: Limits %+v, want all off", got)
	}

	if l := (Protection{}).Limiter(); l != nil {
		t.Errorf("no instance rate: Limiter %v, want nil", l)
	}
	for _, tc := range []struct {
		rate  float64
		burst int
		want  int
	}{{20000, 20000, 20000}, {50, 0, 50}, {0.5, 0, 1}} {
		l := Protection{InstanceRate: tc.rate, InstanceBurst: tc.burst}.Limiter()
		if l == nil || float64(l.Limit()) != tc.rate || l.Burst() != tc.want {
			t.Errorf("Limiter(%v, %d) = %v, want rate %v burst %d", tc.rate, tc.burst, l, tc.rate, tc.want)
		}
	}

	if ps := (Protection{}).TrustedProxies(); ps != nil {
		t.Errorf("no proxies: %v, want nil", ps)
	}
	if ps := (Protection{Proxies: "10.0.0.0/8"}).TrustedProxies(); ps == nil {
		t.Error("10.0.0.0/8: nil, want the proxies")
	}
}
