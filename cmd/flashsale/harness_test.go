package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/invariant"
	"github.com/flashsale/flashsale/internal/testenv"
)

const (
	testSecret = "test-user-secret"
	testAdmin  = "test-admin-token"
)

// harness is one in-process flashsale on its own database, Redis prefix and
// JetStream, served over real HTTP.
type harness struct {
	t   *testing.T
	cfg config
	a   *app
	srv *httptest.Server
	hc  *http.Client
	// srvURL is the base URL of the service (set for processes; srv.URL otherwise).
	srvURL  string
	stopped sync.Once
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testConfig returns the service's defaults pointed at fresh, isolated
// services. nats is "embedded" or "external" (an in-process server on a free port).
func testConfig(t *testing.T, nats string, overrides ...string) config {
	t.Helper()
	env := map[string]string{
		"FLASHSALE_DATABASE_URL":      testenv.Database(t),
		"FLASHSALE_USER_TOKEN_SECRET": testSecret,
		"FLASHSALE_ADMIN_TOKEN":       testAdmin,
		"FLASHSALE_DATA_DIR":          t.TempDir(),
		"FLASHSALE_RELAY_GRACE":       "500ms",
		"FLASHSALE_DRAIN_DELAY":       "0", // no balancer to wait for
	}
	env["FLASHSALE_REDIS_URL"], env["FLASHSALE_REDIS_PREFIX"] = testenv.Redis(t)
	if nats == "external" {
		env["FLASHSALE_NATS_URL"] = testenv.NATS(t)
	}
	for i := 0; i+1 < len(overrides); i += 2 {
		env[overrides[i]] = overrides[i+1]
	}
	cfg, err := parseConfig("test", nil, func(k string) string { return env[k] }, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// slowEndToEnd marks an end-to-end test that takes seconds (a fault, a
// kill, a browser, a benchmark run): make test-short (go test -short)
// skips it, make test runs it.
func slowEndToEnd(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow end-to-end test; runs in make test")
	}
}

func newHarness(t *testing.T, cfg config) *harness {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, err := start(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.handler)
	h := &harness{t: t, cfg: cfg, a: a, srv: srv, srvURL: srv.URL,
		hc: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}}
	t.Cleanup(h.stop)
	return h
}

// stop closes the instance's server and stops the instance (once; the
// test's cleanup calls it too).
func (h *harness) stop() {
	h.stopped.Do(func() {
		h.srv.Close()
		h.a.close()
	})
}

type reply struct {
	Status int
	Body   map[string]any
	Raw    string
}

func (r reply) code() string {
	if e, ok := r.Body["error"].(map[string]any); ok {
		s, _ := e["code"].(string)
		return s
	}
	return ""
}

func (r reply) str(k string) string { s, _ := r.Body[k].(string); return s }

// do sends a request; headers are "Name: value" strings.
func (h *harness) do(method, path, body string, headers ...string) reply {
	h.t.Helper()
	req, err := http.NewRequest(method, h.srvURL+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, hv := range headers {
		k, v, _ := strings.Cut(hv, ": ")
		req.Header.Set(k, v)
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		h.t.Logf("%s %s: %v", method, path, err)
		return reply{}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{Status: resp.StatusCode, Raw: string(raw)}
	_ = json.Unmarshal(raw, &r.Body)
	return r
}

func userToken(t testing.TB, user string) string {
	tok, err := httpapi.Sign(testSecret, user, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// doUntilAnswered sends a request again while it is answered 503 ("retry
// shortly": a change's lock or the sale's reload outlasted the request's
// time on a busy machine), for up to 30 s, as an operator's client does.
// Only for requests whose repetition is harmless (absolute settings, reads).
func (h *harness) doUntilAnswered(method, path, body string, headers ...string) reply {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := h.do(method, path, body, headers...)
		if r.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return r
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (h *harness) putSKU(sku, body string) reply {
	return h.do(http.MethodPut, "/admin/v1/skus/"+sku, body, "Authorization: Bearer "+testAdmin)
}

// putSKUAnswered sends a PUT of sku again while it is answered 503 (retry
// shortly), as an operator's client does, until another answer or 30 s. A
// PUT is a replacement, safe to repeat; a retry of one whose first answer
// was lost after it committed is answered 200, not 201: see saved.
func (h *harness) putSKUAnswered(sku, body string) reply {
	h.t.Helper()
	return h.doUntilAnswered(http.MethodPut, "/admin/v1/skus/"+sku, body, "Authorization: Bearer "+testAdmin)
}

// saved reports whether a PUT of a sale was applied: 201, or 200 for a
// retry that found its own first attempt applied.
func saved(r reply) bool { return r.Status == http.StatusCreated || r.Status == http.StatusOK }

// mustPutSKU creates or replaces a sale, sending the PUT again while it is
// answered 503 (retry shortly: on a busy machine the sale's first load into
// Redis can outlast the request's time), as an operator's client does; a
// PUT is a replacement, safe to repeat.
func (h *harness) mustPutSKU(sku string, stock, limit int) {
	h.t.Helper()
	var r reply
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r = h.putSKU(sku, fmt.Sprintf(`{"stock":%d,"per_user_limit":%d}`, stock, limit))
		if r.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
	}
	if r.Status != http.StatusCreated && r.Status != http.StatusOK {
		h.t.Fatalf("put sku: %d %s", r.Status, r.Raw)
	}
}

func (h *harness) buy(user, sku string, qty int, idemKey string) reply {
	hdr := []string{"Authorization: Bearer " + userToken(h.t, user)}
	if idemKey != "" {
		hdr = append(hdr, "Idempotency-Key: "+idemKey)
	}
	return h.do(http.MethodPost, "/api/v1/orders", fmt.Sprintf(`{"sku_id":%q,"quantity":%d}`, sku, qty), hdr...)
}

// buyUntilAnswered buys as a well-behaved client does: with an
// Idempotency-Key, sending the same request again while the answer is 503
// ("retry shortly": a Redis call that timed out on a busy machine, a sale
// still loading), until another answer or within has passed. A purchase
// whose first answer was lost is then answered with its order, once.
func (h *harness) buyUntilAnswered(user, sku string, qty int, idemKey string, within time.Duration) reply {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		r := h.buy(user, sku, qty, idemKey)
		if r.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pay pays order id as its owner user does: sending the same payment again
// while the answer is 503 ("retry shortly": the request ran out of its time
// in the database of a busy machine), until another answer or 30 s. Paying
// is idempotent (a paid order paid again answers 200 with the order), so a
// payment that committed before its answer was lost is answered paid; one
// that did not commit is made again, or told order_expired if its deadline
// passed meanwhile. body is the JSON body, or "" for none.
func (h *harness) pay(user, id, body string) reply {
	h.t.Helper()
	hdr := []string{"Authorization: Bearer " + userToken(h.t, user)}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r := h.do(http.MethodPost, "/api/v1/orders/"+id+"/pay", body, hdr...)
		if r.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return r
		}
	}
}

// settle waits until the sale is idle and every invariant holds, or fails
// with the last report.
func settle(t *testing.T, a *app, sku string, accepted []string, within time.Duration) invariant.Report {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		rep, err := invariant.Check(context.Background(), a.store, a.gate, sku, accepted, true)
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK() {
			return rep
		}
		if time.Now().After(deadline) {
			t.Fatalf("invariants still violated after %v: %v\n%+v", within, rep.Violations, rep)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
