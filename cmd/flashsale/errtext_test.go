package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestErrorsShowNoInternals provokes errors whose text names Go types,
// packages, drivers, addresses or a cancelled context (a malformed body, a
// reduction below the units sold, a request that times out waiting for the
// SKU's change lock, the database and Redis down) and checks that no
// response shows any of it: the message is a fixed sentence per code (or
// the client's own mistake in its terms), the detail goes to the log.
func TestErrorsShowNoInternals(t *testing.T) {
	t.Parallel()
	dbURL, err := url.Parse(testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	dbProxy := testenv.StartProxy(t, dbURL.Host)
	dbURL.Host = dbProxy.Addr()
	rURL, prefix := testenv.Redis(t)
	ru, err := url.Parse(rURL)
	if err != nil {
		t.Fatal(err)
	}
	redisProxy := testenv.StartProxy(t, ru.Host)
	ru.Host = redisProxy.Addr()
	h := newHarness(t, testConfig(t, "external", "FLASHSALE_DATABASE_URL", dbURL.String(),
		"FLASHSALE_REDIS_URL", ru.String(), "FLASHSALE_REDIS_PREFIX", prefix))
	h.mustPutSKU("c", 10, 2)
	check := func(what string, r reply, wantStatus int, wantCode string) {
		t.Helper()
		if r.Status != wantStatus || r.code() != wantCode {
			t.Errorf("%s: %d %s, want %d %s", what, r.Status, r.Raw, wantStatus, wantCode)
		}
		checkErrorBody(t, what, r)
	}

	// Wrong JSON types: encoding/json names the Go struct and field types.
	r := h.putSKU("c", `{"stock":"10","per_user_limit":2}`)
	check("wrong type", r, 400, "invalid_request")
	if msg := r.Body["error"].(map[string]any)["message"]; msg != `field "stock" must be a whole number in range` {
		t.Errorf("wrong type: message %q", msg)
	}
	check("unknown field", h.putSKU("c", `{"stock":10,"per_user_limit":2,"colour":1}`), 400, "invalid_request")
	check("syntax", h.putSKU("c", `{"stock":10,`), 400, "invalid_request")
	check("bad time", h.putSKU("c", `{"stock":10,"per_user_limit":2,"ends_at":"soon"}`), 400, "invalid_request")
	check("order wrong type", h.do(http.MethodPost, "/api/v1/orders", `{"sku_id":5}`, "Authorization: Bearer "+userToken(t, "u")), 400, "invalid_request")

	// A reduction below the units sold: the store's error names the package.
	if r := h.buy("u1", "c", 2, ""); r.Status != http.StatusAccepted {
		t.Fatalf("buy: %d %s", r.Status, r.Raw)
	}
	settle(t, h.a, "c", nil, 20*time.Second)
	check("stock conflict", h.putSKU("c", `{"stock":1,"per_user_limit":2}`), 409, "stock_conflict")

	// A request that times out waiting for the SKU's change lock, which
	// another instance holds.
	ctx := context.Background()
	if ok, err := h.a.gate.LockSKU(ctx, "c", "another-instance", 30*time.Second); err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	req := httptest.NewRequestWithContext(rctx, http.MethodPut, "/admin/v1/skus/c", strings.NewReader(`{"stock":11,"per_user_limit":2}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	rec := httptest.NewRecorder()
	h.a.handler.ServeHTTP(rec, req)
	cancel()
	r = reply{Status: rec.Code, Raw: rec.Body.String()}
	_ = json.Unmarshal(rec.Body.Bytes(), &r.Body)
	check("change lock timeout", r, 503, "unavailable")
	if err := h.a.gate.UnlockSKU(ctx, "c", "another-instance"); err != nil {
		t.Fatal(err)
	}

	// A reduction while Redis does not hold the sale says what to do.
	if err := h.a.gate.Fence(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	// Sent again while the answer is the plain "retry shortly" (the
	// request ran out of its time on a loaded machine: a CI run saw it),
	// as an operator's client does: a PUT is a replacement.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r = h.putSKU("c", `{"stock":9,"per_user_limit":2}`)
		e, _ := r.Body["error"].(map[string]any)
		msg, _ := e["message"].(string)
		if r.Status != http.StatusServiceUnavailable || strings.Contains(msg, "warm it up") || time.Now().After(deadline) {
			break
		}
	}
	check("reduction of an unloaded sale", r, 503, "unavailable")
	if msg, _ := r.Body["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "warm it up") {
		t.Errorf("reduction of an unloaded sale: %s", r.Raw)
	}
	// A warm-up is a reload, safe to send again while 503 (busy machine).
	if r := h.doUntilAnswered(http.MethodPost, "/admin/v1/skus/c/warmup", "", "Authorization: Bearer "+testAdmin); r.Status != http.StatusOK {
		t.Fatalf("warmup: %d %s", r.Status, r.Raw)
	}

	// The database and Redis down: readiness and purchases (the fallback).
	dbProxy.Cut()
	redisProxy.Cut()
	r = h.do(http.MethodGet, "/readyz", "")
	if r.Status != http.StatusServiceUnavailable {
		t.Errorf("readyz with the database down: %d %s", r.Status, r.Raw)
	}
	for name, v := range r.Body["checks"].(map[string]any) {
		if v != "ok" && v != "unavailable" {
			t.Errorf("readyz check %s shows %q", name, v)
		}
	}
	for i := range 5 {
		r := h.buy("u2", "c", 1, "")
		if r.Status < 500 {
			t.Errorf("buy %d with everything down: %d %s", i, r.Status, r.Raw)
		}
		checkErrorBody(t, "buy with everything down", r)
	}
	if r := h.putSKU("c", `{"stock":12,"per_user_limit":2}`); r.Status < 500 {
		t.Errorf("put with everything down: %d %s", r.Status, r.Raw)
	} else {
		checkErrorBody(t, "put with everything down", r)
	}
	dbProxy.Restore()
	redisProxy.Restore()
}
