package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"time"

	"golang.org/x/time/rate"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// protectConfig is the settings of the protections in front of the gate:
// rate limits, the sold-out flag, trusted proxies and the trusted gateway.
type protectConfig struct {
	InstanceRate  float64
	InstanceBurst int
	SKURate       float64
	SKUBurst      int
	UserRate      float64
	UserBurst     int
	IPRate        float64
	IPBurst       int
	SoldOutTTL    time.Duration
	Proxies       string
	GatewayHeader string
}

func (p *protectConfig) flags(e *envFlags) {
	e.float(&p.InstanceRate, "rate-limit-instance", "FLASHSALE_RATE_LIMIT_INSTANCE", 20000, "buyer API requests per second this instance takes before answering 429 (0: no limit)")
	e.int(&p.InstanceBurst, "rate-limit-instance-burst", "FLASHSALE_RATE_LIMIT_INSTANCE_BURST", 20000, "burst of the instance limit (0: one second's worth)")
	e.float(&p.SKURate, "rate-limit-sku", "FLASHSALE_RATE_LIMIT_SKU", 0, "purchase attempts per second per SKU, over all instances (0: no limit)")
	e.int(&p.SKUBurst, "rate-limit-sku-burst", "FLASHSALE_RATE_LIMIT_SKU_BURST", 0, "burst of the SKU limit (0: one second's worth)")
	e.float(&p.UserRate, "rate-limit-user", "FLASHSALE_RATE_LIMIT_USER", 2, "purchase attempts per second per user and SKU, over all instances (0: no limit)")
	e.int(&p.UserBurst, "rate-limit-user-burst", "FLASHSALE_RATE_LIMIT_USER_BURST", 5, "burst of the user limit (0: one second's worth)")
	e.float(&p.IPRate, "rate-limit-ip", "FLASHSALE_RATE_LIMIT_IP", 0, "purchase attempts per second per client IP (IPv6: per /64) and SKU, over all instances (0: no limit)")
	e.int(&p.IPBurst, "rate-limit-ip-burst", "FLASHSALE_RATE_LIMIT_IP_BURST", 0, "burst of the IP limit (0: one second's worth)")
	e.dur(&p.SoldOutTTL, "sold-out-ttl", "FLASHSALE_SOLD_OUT_TTL", time.Second, "how long a sold-out SKU is answered from memory before one request asks Redis again (0: no sold-out flag)")
	e.str(&p.Proxies, "trusted-proxies", "FLASHSALE_TRUSTED_PROXIES", "", "CIDRs or addresses of proxies whose X-Forwarded-For is believed (empty: the socket peer is the client)")
	e.str(&p.GatewayHeader, "trusted-gateway-header", "FLASHSALE_TRUSTED_GATEWAY_HEADER", "", "header (e.g. X-User-Id) naming the authenticated user, believed only from trusted proxies (empty: off; every buyer needs a token)")
}

func (p protectConfig) check() error {
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
	proxies, err := httpapi.ParseProxies(p.Proxies)
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

// limits returns the purchase path's limits.
func (p protectConfig) limits() purchase.Limits {
	rt := func(r float64, b int) stockgate.Rate {
		if r <= 0 {
			return stockgate.Rate{}
		}
		return stockgate.Rate{PerSecond: r, Burst: burstOf(r, b)}
	}
	return purchase.Limits{SKU: rt(p.SKURate, p.SKUBurst), User: rt(p.UserRate, p.UserBurst), IP: rt(p.IPRate, p.IPBurst), SoldOutTTL: p.SoldOutTTL}
}

// limiter returns the instance's limiter (nil: no limit).
func (p protectConfig) limiter() *rate.Limiter {
	if p.InstanceRate <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(p.InstanceRate), burstOf(p.InstanceRate, p.InstanceBurst))
}

// proxies returns the trusted proxies (checked by check).
func (p protectConfig) proxies() *httpapi.Proxies {
	ps, _ := httpapi.ParseProxies(p.Proxies)
	return ps
}

// ReserveLimited is the purchase path's gate call, bounded like Reserve.
func (g timeoutGate) ReserveLimited(ctx context.Context, r sale.Reservation, l stockgate.Limits) (stockgate.ReserveResult, error) {
	ctx, cancel := context.WithTimeout(ctx, g.d)
	defer cancel()
	start := time.Now()
	res, err := g.Gate.ReserveLimited(ctx, r, l)
	g.m.Gate(time.Since(start))
	return res, err
}

// Duplicate is the idempotency look-up of a sold-out SKU, bounded like Reserve.
func (g timeoutGate) Duplicate(ctx context.Context, sku, user, key string) (string, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, g.d)
	defer cancel()
	return g.Gate.Duplicate(ctx, sku, user, key)
}
