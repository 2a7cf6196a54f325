package httpapi

import (
	"fmt"
	"math"
	"net/http"
	"time"

	"golang.org/x/time/rate"

	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// Protection is the settings of the protections in front of the gate: the
// instance's rate limit (Limiter), the distributed rate limits and the
// sold-out flag of the purchase path (Limits), trusted proxies (Proxies)
// and the trusted gateway header. A rate of 0 turns its limit off; a burst
// of 0 is one second's worth.
type Protection struct {
	InstanceRate  float64
	InstanceBurst int
	SKURate       float64
	SKUBurst      int
	UserRate      float64
	UserBurst     int
	IPRate        float64
	IPBurst       int
	SoldOutTTL    time.Duration
	SoldOutLease  time.Duration
	Proxies       string
	GatewayHeader string
}

// Check returns an error naming the first setting out of range; the names
// are those of the settings (rate-limit-user, trusted-proxies, ...).
func (p Protection) Check() error {
	for _, r := range []struct {
		name  string
		rate  float64
		burst int
	}{{"instance", p.InstanceRate, p.InstanceBurst}, {"sku", p.SKURate, p.SKUBurst}, {"user", p.UserRate, p.UserBurst}, {"ip", p.IPRate, p.IPBurst}} {
		if r.rate < 0 || math.IsNaN(r.rate) || math.IsInf(r.rate, 0) || r.rate > 1e7 {
			return fmt.Errorf("rate-limit-%s must be 0..1e7 requests per second", r.name)
		}
		if r.burst < 0 || r.burst > 1e7 {
			return fmt.Errorf("rate-limit-%s-burst must be 0..1e7", r.name)
		}
	}
	if p.SoldOutTTL < 0 {
		return fmt.Errorf("sold-out-ttl must be 0 or more")
	}
	if p.SoldOutLease != 0 && (p.SoldOutLease < 300*time.Millisecond || p.SoldOutLease > 10*time.Second) {
		return fmt.Errorf("sold-out-lease must be 0 (off) or 300ms..10s, got %s", p.SoldOutLease)
	}
	proxies, err := ParseProxies(p.Proxies)
	if err != nil {
		return err
	}
	if p.GatewayHeader != "" {
		if proxies == nil {
			return fmt.Errorf("trusted-gateway-header needs trusted-proxies: the header is believed only from them")
		}
		if !validHeaderName(p.GatewayHeader) || http.CanonicalHeaderKey(p.GatewayHeader) == "Authorization" {
			return fmt.Errorf("trusted-gateway-header: %q is not a usable header name", p.GatewayHeader)
		}
	}
	return nil
}

func validHeaderName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

func burstOf(r float64, burst int) int {
	if burst > 0 {
		return burst
	}
	return max(1, int(math.Ceil(r)))
}

// Limits returns the purchase path's limits.
func (p Protection) Limits() purchase.Limits {
	rt := func(r float64, b int) stockgate.Rate {
		if r <= 0 {
			return stockgate.Rate{}
		}
		return stockgate.Rate{PerSecond: r, Burst: burstOf(r, b)}
	}
	return purchase.Limits{SKU: rt(p.SKURate, p.SKUBurst), User: rt(p.UserRate, p.UserBurst), IP: rt(p.IPRate, p.IPBurst), SoldOutTTL: p.SoldOutTTL,
		SoldOutLease: p.SoldOutLease}
}

// Limiter returns the instance's limiter, for Config.Limiter (nil: no limit).
func (p Protection) Limiter() *rate.Limiter {
	if p.InstanceRate <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(p.InstanceRate), burstOf(p.InstanceRate, p.InstanceBurst))
}

// TrustedProxies returns the trusted proxies; nil (trust nobody) for a list
// Check refuses.
func (p Protection) TrustedProxies() *Proxies {
	ps, _ := ParseProxies(p.Proxies)
	return ps
}
