package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/flashsale/flashsale/api"
	"github.com/flashsale/flashsale/internal/altcha"
	"github.com/flashsale/flashsale/internal/orderstore"
)

func init() {
	// The dashboard's page: a string, as text/plain is.
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
}

// contract drives a harness through the HTTP API and checks every
// exchange against api/openapi.yaml.
type contract struct {
	t      *testing.T
	h      *harness
	doc    *openapi3.T
	router routers.Router
	hc     *http.Client
	// covered counts the validated responses by "METHOD /spec/path status".
	covered map[string]int
}

func newContract(t *testing.T, h *harness) *contract {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &contract{t: t, h: h, doc: doc, router: router, covered: map[string]int{},
		hc: &http.Client{Timeout: 20 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// call sends one request and checks: the status is want; the request is
// valid by the spec exactly when reqValid (the spec is as strict as the
// server); the response is valid by the spec (every status documented).
// Headers are "Name: value"; a body gets Content-Type application/json
// unless one is given.
func (c *contract) call(want int, reqValid bool, method, path, body string, headers ...string) reply {
	c.t.Helper()
	return c.callOneOf([]int{want}, reqValid, method, path, body, headers...)
}

// callOneOf is call for a request whose answer may be any of wants (a
// retry answered 202 while its order is queued, 200 once it is decided).
func (c *contract) callOneOf(wants []int, reqValid bool, method, path, body string, headers ...string) reply {
	c.t.Helper()
	newReq := func() *http.Request {
		req, err := http.NewRequest(method, c.h.srvURL+path, strings.NewReader(body))
		if err != nil {
			c.t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for _, hv := range headers {
			k, v, _ := strings.Cut(hv, ": ")
			req.Header.Set(k, v)
		}
		return req
	}
	// A payment (by its owner or by the provider's callback) is sent again
	// while it is answered 503 "retry shortly", as a payer's client does:
	// paying is idempotent, so the answer that counts is the first other one.
	again := method == http.MethodPost && (strings.HasSuffix(path, "/pay") || path == "/api/v1/payments/callback") &&
		!slices.Contains(wants, http.StatusServiceUnavailable)
	var resp *http.Response
	var raw []byte
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		resp, err = c.hc.Do(newReq())
		if err != nil {
			c.t.Fatalf("%s %s: %v", method, path, err)
		}
		raw, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if !again || resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
	}
	r := reply{Status: resp.StatusCode, Raw: string(raw)}
	_ = json.Unmarshal(raw, &r.Body)
	if !slices.Contains(wants, r.Status) {
		c.t.Fatalf("%s %s %s: %d %s, want %v", method, path, body, r.Status, r.Raw, wants)
	}
	if r.Status >= 400 {
		checkErrorBody(c.t, method+" "+path, r)
	}

	vreq := newReq()
	route, params, err := c.router.FindRoute(vreq)
	if err != nil {
		// Not a route of the spec: only the error shape can be checked.
		if reqValid || r.Status != http.StatusNotFound && r.Status != http.StatusMethodNotAllowed {
			c.t.Fatalf("%s %s: not in the spec (%v), answered %d", method, path, err, r.Status)
		}
		schema := c.doc.Components.Schemas["Error"].Value
		var v any
		_ = json.Unmarshal(raw, &v)
		if err := schema.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
			c.t.Fatalf("%s %s: error body %s: %v", method, path, raw, err)
		}
		return r
	}
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
	if err := openapi3filter.ValidateRequest(context.Background(), in); (err == nil) != reqValid {
		c.t.Fatalf("%s %s %s: request valid by the spec = %v, want %v (%v)", method, path, body, err == nil, reqValid, err)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: r.Status, Header: resp.Header,
		Body: io.NopCloser(bytes.NewReader(raw)), Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		c.t.Fatalf("%s %s %s: response %d %s does not match the spec: %v", method, path, body, r.Status, raw, err)
	}
	c.covered[fmt.Sprintf("%s %s %d", method, route.Path, r.Status)]++
	return r
}

// internalText are fragments of Go, driver and package error texts that a
// client must never see.
var internalText = []string{"orderstore", "reconcile", "stockgate", "pgx", "pgconn", "mysql", "SQLSTATE", "sql:", "redis", "rueidis",
	"nats", "jetstream", "context canceled", "context deadline", "deadline exceeded", "json:", "Go struct", "Go value", "struct field",
	"tcp ", "connection refused", "connection reset", "EOF", "%!", "lock", "sku c ", "\n"}

// checkErrorBody asserts an error response has a code and a message free of
// internal text.
func checkErrorBody(t *testing.T, what string, r reply) {
	t.Helper()
	e, _ := r.Body["error"].(map[string]any)
	code, _ := e["code"].(string)
	msg, _ := e["message"].(string)
	if code == "" || msg == "" {
		t.Fatalf("%s: %d %s: no error code and message", what, r.Status, r.Raw)
	}
	for _, frag := range internalText {
		if strings.Contains(strings.ToLower(msg), strings.ToLower(frag)) {
			t.Errorf("%s: %d %s: the message shows internal text %q", what, r.Status, r.Raw, frag)
		}
	}
}

func adminSKU(t *testing.T, r reply, total, sold, dbStock int) {
	t.Helper()
	if r.Body["stock"] != float64(total) || r.Body["total_stock"] != float64(total) || r.Body["sold"] != float64(sold) || r.Body["db_stock"] != float64(dbStock) {
		t.Fatalf("admin sku %s: want stock = total_stock %d, sold %d, db_stock %d", r.Raw, total, sold, dbStock)
	}
}

// TestOpenAPIContract drives the real service through every route of
// api/openapi.yaml, success and error paths, and validates each request
// and response against the spec with kin-openapi.
func TestOpenAPIContract(t *testing.T) {
	t.Parallel()
	const cbSecret = "contract-callback-secret"
	h := newHarness(t, testConfig(t, "external", "FLASHSALE_PAYMENT_SECRET", cbSecret, "FLASHSALE_APPLY_BACKOFF", "50ms"))
	c := newContract(t, h)
	ctx := context.Background()
	admin := "Authorization: Bearer " + testAdmin
	user := func(u string) string { return "Authorization: Bearer " + userToken(t, u) }
	merge := "Content-Type: application/merge-patch+json"

	// Operations.
	c.call(200, true, "GET", "/openapi.yaml", "")
	c.call(200, true, "GET", "/healthz", "")
	c.call(200, true, "GET", "/readyz", "")
	c.call(200, true, "GET", "/metrics", "")
	c.call(200, true, "GET", "/dashboard/", "")
	c.call(200, true, "GET", "/sale/any-sale", "")
	c.call(404, true, "GET", "/sale/assets/", "")
	if r := c.call(302, true, "GET", "/", ""); r.Status != 302 {
		t.Fatal(r.Raw)
	}
	c.call(404, false, "GET", "/nowhere", "")
	c.call(405, false, "DELETE", "/admin/v1/skus/c", "", admin)

	// PUT: create, replace, and every refusal.
	r := c.call(201, true, "PUT", "/admin/v1/skus/c", `{"stock":10,"per_user_limit":2}`, admin)
	adminSKU(t, r, 10, 0, 10)
	r = c.call(200, true, "PUT", "/admin/v1/skus/c", `{"stock":10,"per_user_limit":2,"starts_at":null,"ends_at":"2999-01-01T00:00:00Z"}`, admin)
	if r.str("ends_at") != "2999-01-01T00:00:00.000Z" || r.Body["created"] != false {
		t.Fatal(r.Raw)
	}
	c.call(401, true, "PUT", "/admin/v1/skus/c", `{"stock":10,"per_user_limit":2}`)
	c.call(401, true, "PUT", "/admin/v1/skus/c", `{"stock":10,"per_user_limit":2}`, "Authorization: Bearer wrong")
	c.call(400, false, "PUT", "/admin/v1/skus/c", `{"stock":10,"per_user_limit":2,"color":"red"}`, admin)
	c.call(400, false, "PUT", "/admin/v1/skus/c", `{"stock":"10","per_user_limit":2}`, admin)
	c.call(400, false, "PUT", "/admin/v1/skus/c", `{"stock":-1,"per_user_limit":2}`, admin)
	c.call(400, false, "PUT", "/admin/v1/skus/c", `{"per_user_limit":2}`, admin)
	c.call(400, false, "PUT", "/admin/v1/skus/c", `{"stock":10,"per_user_limit":2,"ends_at":"tomorrow"}`, admin)
	c.call(400, true, "PUT", "/admin/v1/skus/c", `{"stock":10,"per_user_limit":2,"starts_at":"2030-01-02T00:00:00Z","ends_at":"2030-01-01T00:00:00Z"}`, admin)
	c.call(400, false, "PUT", "/admin/v1/skus/bad!id", `{"stock":10,"per_user_limit":2}`, admin)
	c.call(415, false, "PUT", "/admin/v1/skus/c", `{"stock":10,"per_user_limit":2}`, admin, "Content-Type: text/plain")
	c.call(413, false, "PUT", "/admin/v1/skus/c", `{"stock":10,"per_user_limit":2,"x":"`+strings.Repeat("a", 9000)+`"}`, admin)

	// PATCH: only the fields present change; null clears; strict input.
	r = c.call(200, true, "PATCH", "/admin/v1/skus/c", `{"stock":12}`, admin, merge)
	adminSKU(t, r, 12, 0, 12)
	if r.str("ends_at") != "2999-01-01T00:00:00.000Z" || r.Body["per_user_limit"] != float64(2) {
		t.Fatalf("patch of stock changed more: %s", r.Raw)
	}
	r = c.call(200, true, "PATCH", "/admin/v1/skus/c", `{"ends_at":null,"per_user_limit":3}`, admin)
	if r.Body["ends_at"] != nil || r.Body["per_user_limit"] != float64(3) || r.Body["stock"] != float64(12) {
		t.Fatalf("patch ends_at null: %s", r.Raw)
	}
	c.call(200, true, "PATCH", "/admin/v1/skus/c", `{"per_user_limit":2}`, admin, merge)
	for _, bad := range []string{`{"stock":null}`, `{"stock":"1"}`, `{"stock":-5}`, `{"per_user_limit":0}`, `{"color":"red"}`, `{"ends_at":5}`, `[]`} {
		c.call(400, false, "PATCH", "/admin/v1/skus/c", bad, admin, merge)
	}
	// What JSON Schema cannot say: a key given twice, a window that ends before it starts.
	c.call(400, true, "PATCH", "/admin/v1/skus/c", `{"stock":1,"stock":2}`, admin, merge)
	c.call(400, true, "PATCH", "/admin/v1/skus/c", `{"starts_at":"2999-06-01T00:00:00Z","ends_at":"2999-01-01T00:00:00Z"}`, admin, merge)
	c.call(404, true, "PATCH", "/admin/v1/skus/nope", `{"stock":1}`, admin, merge)
	c.call(415, false, "PATCH", "/admin/v1/skus/c", `{"stock":1}`, admin, "Content-Type: text/plain")
	c.call(401, true, "PATCH", "/admin/v1/skus/c", `{"stock":1}`, merge)

	// Restock by a delta.
	r = c.call(200, true, "POST", "/admin/v1/skus/c/restock", `{"delta":5}`, admin)
	adminSKU(t, r, 17, 0, 17)
	for _, bad := range []string{`{"delta":0}`, `{}`, `{"delta":1.5}`, `{"delta":"5"}`, `{"delta":5,"why":"x"}`} {
		c.call(400, false, "POST", "/admin/v1/skus/c/restock", bad, admin)
	}
	c.call(400, true, "POST", "/admin/v1/skus/c/restock", `{"delta":-18}`, admin)
	c.call(404, true, "POST", "/admin/v1/skus/nope/restock", `{"delta":1}`, admin)
	r = c.call(200, true, "GET", "/admin/v1/skus/c", "", admin)
	adminSKU(t, r, 17, 0, 17) // the refusals changed nothing
	c.call(404, true, "GET", "/admin/v1/skus/nope", "", admin)
	c.call(401, true, "GET", "/admin/v1/skus/c", "")
	c.call(200, true, "PATCH", "/admin/v1/skus/c", `{}`, admin, merge)

	// Warm-up.
	c.call(200, true, "POST", "/admin/v1/skus/c/warmup", "", admin)
	c.call(404, true, "POST", "/admin/v1/skus/nope/warmup", "", admin)

	// Buyers.
	c.call(200, true, "GET", "/api/v1/skus/c", "")
	c.call(404, true, "GET", "/api/v1/skus/nope", "")
	c.call(400, false, "GET", "/api/v1/skus/bad!id", "")
	order := func(u, key string) string {
		t.Helper()
		r := c.call(202, true, "POST", "/api/v1/orders", `{"sku_id":"c","quantity":1}`, user(u), "Idempotency-Key: "+key)
		return r.str("order_id")
	}
	alice := order("alice", "k-alice")
	// A retry with the key: 202 while the order is queued, 200 with the
	// order once the database has it (which may already be the case).
	retry := func(wants ...int) {
		t.Helper()
		r := c.callOneOf(wants, true, "POST", "/api/v1/orders", `{"sku_id":"c","quantity":1}`, user("alice"), "Idempotency-Key: k-alice")
		if again := r.str("order_id"); again != alice {
			t.Fatalf("retry with the key: %s, want %s", again, alice)
		}
	}
	retry(202, 200)
	waitFor(t, 20*time.Second, "alice's order in the database", func() bool {
		return c.h.do("GET", "/api/v1/orders/"+alice, "", user("alice")).str("status") == "pending_payment"
	})
	retry(200)
	c.call(401, true, "POST", "/api/v1/orders", `{"sku_id":"c"}`)
	c.call(400, false, "POST", "/api/v1/orders", `{"sku_id":"c","quantity":0}`, user("alice"))
	c.call(400, false, "POST", "/api/v1/orders", `{"sku_id":"c","quantity":"1"}`, user("alice"))
	c.call(400, false, "POST", "/api/v1/orders", `{"sku_id":"c","qty":1}`, user("alice"))
	c.call(400, false, "POST", "/api/v1/orders", `{"sku_id":"c"}`, user("alice"), "Idempotency-Key: has space")
	c.call(404, true, "POST", "/api/v1/orders", `{"sku_id":"nope"}`, user("alice"))
	c.call(409, true, "POST", "/api/v1/orders", `{"sku_id":"c","quantity":2}`, user("alice"))
	c.call(415, false, "POST", "/api/v1/orders", `{"sku_id":"c"}`, user("alice"), "Content-Type: text/plain")
	bob := order("bob", "k-bob")
	carol := order("carol", "k-carol")

	waitPending := func(u, id string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			r := c.call(200, true, "GET", "/api/v1/orders/"+id, "", user(u))
			if r.str("status") == "pending_payment" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("order %s: %s", id, r.Raw)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitPending("alice", alice)
	waitPending("bob", bob)
	waitPending("carol", carol)
	c.call(404, true, "GET", "/api/v1/orders/"+alice, "", user("mallory"))
	c.call(404, false, "GET", "/api/v1/orders/not-an-id", "", user("alice"))
	c.call(401, true, "GET", "/api/v1/orders/"+alice, "")

	// Allocation with units sold: a reduction below them is refused.
	r = c.call(200, true, "GET", "/admin/v1/skus/c", "", admin)
	adminSKU(t, r, 17, 3, 14)
	c.call(409, true, "PATCH", "/admin/v1/skus/c", `{"stock":2}`, admin, merge)
	c.call(409, true, "POST", "/admin/v1/skus/c/restock", `{"delta":-15}`, admin)
	c.call(409, true, "PUT", "/admin/v1/skus/c", `{"stock":2,"per_user_limit":2}`, admin)
	r = c.call(200, true, "POST", "/admin/v1/skus/c/restock", `{"delta":-14}`, admin)
	adminSKU(t, r, 3, 3, 0)
	c.call(409, true, "POST", "/api/v1/orders", `{"sku_id":"c"}`, user("dave"))

	// Pay, cancel, callback.
	r = c.call(200, true, "POST", "/api/v1/orders/"+alice+"/pay", `{"payment_ref":"r-1"}`, user("alice"))
	if r.str("status") != "paid" {
		t.Fatal(r.Raw)
	}
	c.call(200, true, "POST", "/api/v1/orders/"+alice+"/pay", "", user("alice"))
	c.call(400, false, "POST", "/api/v1/orders/"+alice+"/pay", `{"payment_ref":"r-1","tip":1}`, user("alice"))
	c.call(400, false, "POST", "/api/v1/orders/"+alice+"/pay", `{"payment_ref":"`+strings.Repeat("r", 129)+`"}`, user("alice"))
	c.call(409, true, "POST", "/api/v1/orders/"+alice+"/cancel", "", user("alice"))
	c.call(404, true, "POST", "/api/v1/orders/"+alice+"/pay", "", user("mallory"))
	r = c.call(200, true, "POST", "/api/v1/orders/"+bob+"/cancel", "", user("bob"))
	if r.str("status") != "cancelled" || r.str("cancel_reason") != "user_cancel" {
		t.Fatal(r.Raw)
	}
	c.call(409, true, "POST", "/api/v1/orders/"+bob+"/pay", "", user("bob"))
	cb := fmt.Sprintf(`{"order_id":%q,"payment_ref":"cb-1"}`, carol)
	mac := hmac.New(sha256.New, []byte(cbSecret))
	mac.Write([]byte(cb))
	r = c.call(200, true, "POST", "/api/v1/payments/callback", cb, "X-Flashsale-Signature: sha256="+hex.EncodeToString(mac.Sum(nil)))
	if r.str("status") != "paid" {
		t.Fatal(r.Raw)
	}
	c.call(401, true, "POST", "/api/v1/payments/callback", cb, "X-Flashsale-Signature: sha256=00")
	c.call(401, false, "POST", "/api/v1/payments/callback", cb)

	// Audit trail.
	r = c.call(200, true, "GET", "/admin/v1/skus/c/audit?limit=2", "", admin)
	c.call(200, true, "GET", fmt.Sprintf("/admin/v1/skus/c/audit?after=%v", r.Body["next_after"]), "", admin)
	c.call(400, false, "GET", "/admin/v1/skus/c/audit?limit=0", "", admin)
	c.call(400, false, "GET", "/admin/v1/skus/c/audit?after=x", "", admin)
	c.call(400, false, "GET", "/admin/v1/skus/bad!id/audit", "", admin)

	// Reconcile, overview.
	c.call(200, true, "POST", "/admin/v1/reconcile", "", admin)
	c.call(200, true, "GET", "/admin/v1/overview", "", admin)
	c.call(401, true, "GET", "/admin/v1/overview", "")

	// Dead letters: an order the database refuses every time is dead-lettered.
	poison := []string{`
CREATE FUNCTION refuse_poison() RETURNS trigger AS $$
BEGIN IF NEW.user_id LIKE 'poison%' THEN RAISE EXCEPTION 'poison order %', NEW.order_id; END IF; RETURN NEW; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER refuse_poison BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION refuse_poison()`}
	drop := `DROP TRIGGER refuse_poison ON orders`
	if h.a.store.Dialect() == orderstore.MySQL {
		poison = []string{`
CREATE TRIGGER refuse_poison BEFORE INSERT ON orders FOR EACH ROW
BEGIN IF NEW.user_id LIKE 'poison%' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poison order'; END IF; END`}
		drop = `DROP TRIGGER refuse_poison`
	}
	for _, q := range poison {
		if _, err := h.a.store.DB().ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	c.call(201, true, "PUT", "/admin/v1/skus/d", `{"stock":5,"per_user_limit":1}`, admin)
	c.call(200, true, "PUT", "/admin/v1/skus/d", `{"stock":5,"per_user_limit":1}`, admin)
	order2 := func(u string) {
		c.call(202, true, "POST", "/api/v1/orders", `{"sku_id":"d"}`, user(u))
	}
	order2("poison-1")
	order2("poison-2")
	var seqs []int
	deadline := time.Now().Add(30 * time.Second)
	for len(seqs) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no dead letters: %s", r.Raw)
		}
		time.Sleep(50 * time.Millisecond)
		r = c.call(200, true, "GET", "/admin/v1/dlq?limit=10", "", admin)
		seqs = seqs[:0]
		for _, d := range r.Body["dead_letters"].([]any) {
			seqs = append(seqs, int(d.(map[string]any)["seq"].(float64)))
		}
	}
	if _, err := h.a.store.DB().ExecContext(ctx, drop); err != nil {
		t.Fatal(err)
	}
	c.call(400, false, "GET", "/admin/v1/dlq?limit=5000", "", admin)
	c.call(200, true, "POST", fmt.Sprintf("/admin/v1/dlq/%d/replay", seqs[0]), "", admin)
	c.call(404, true, "POST", fmt.Sprintf("/admin/v1/dlq/%d/replay", seqs[0]), "", admin)
	c.call(200, true, "POST", fmt.Sprintf("/admin/v1/dlq/%d/discard", seqs[1]), "", admin)
	c.call(404, true, "POST", fmt.Sprintf("/admin/v1/dlq/%d/discard", seqs[1]), "", admin)
	c.call(400, false, "POST", "/admin/v1/dlq/0/replay", "", admin)
	c.call(400, false, "POST", "/admin/v1/dlq/x/discard", "", admin)
	settle(t, h.a, "c", nil, 20*time.Second)

	// The crowd: tickets and the waiting room.
	c.call(201, true, "PUT", "/admin/v1/skus/crowd", `{"stock":5,"per_user_limit":1,"ticket_required":true,"waiting_room":true,"admission_rate":1000,"tag":"crowd-sales"}`, admin)
	c.call(409, true, "GET", "/api/v1/skus/c/challenge", "", user("alice"))
	c.call(409, true, "POST", "/api/v1/skus/c/queue", "", user("alice"))
	c.call(401, true, "GET", "/api/v1/skus/crowd/challenge", "")
	c.call(404, true, "GET", "/api/v1/skus/nosuch/challenge", "", user("alice"))
	ch := c.call(200, true, "GET", "/api/v1/skus/crowd/challenge", "", user("alice"))
	payload, _, err := altcha.Solve([]byte(ch.Raw), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	sol := fmt.Sprintf(`{"payload":%q}`, payload)
	c.call(400, true, "POST", "/api/v1/skus/crowd/ticket", `{"payload":"%%%"}`, user("alice"))
	c.call(400, false, "POST", "/api/v1/skus/crowd/ticket", `{}`, user("alice"))
	c.call(403, true, "POST", "/api/v1/skus/crowd/ticket", sol, user("bob"))
	tk := c.call(201, true, "POST", "/api/v1/skus/crowd/ticket", sol, user("alice")).str("ticket")
	c.call(200, true, "POST", "/api/v1/skus/crowd/ticket", sol, user("alice")) // sent again: the same ticket
	c.call(403, true, "POST", "/api/v1/skus/crowd/queue", "", user("alice"))
	c.call(404, true, "GET", "/api/v1/skus/crowd/queue", "", user("alice"))
	c.call(201, true, "POST", "/api/v1/skus/crowd/queue", "", user("alice"), "Flashsale-Ticket: "+tk)
	c.call(403, true, "POST", "/api/v1/orders", `{"sku_id":"crowd","quantity":1}`, user("alice"), "Flashsale-Ticket: "+tk)
	var adm string
	for deadline := time.Now().Add(20 * time.Second); adm == "" && time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		adm = c.call(200, true, "GET", "/api/v1/skus/crowd/queue", "", user("alice")).str("admission")
	}
	if adm == "" {
		t.Fatal("alice was never admitted")
	}
	c.call(403, true, "POST", "/api/v1/orders", `{"sku_id":"crowd","quantity":1}`, user("bob"), "Flashsale-Admission: "+adm)
	c.call(202, true, "POST", "/api/v1/orders", `{"sku_id":"crowd","quantity":1}`, user("alice"), "Flashsale-Admission: "+adm)
	settle(t, h.a, "crowd", nil, 20*time.Second)

	// The sale history: the crowd sale on demand, once its counts are
	// flushed (every second); refusals write nothing.
	var hist reply
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if hist = c.callOneOf([]int{200, 409}, true, "POST", "/admin/v1/history/crowd", "", admin); hist.Status == 200 &&
			hist.Body["accepted"].(float64) >= 1 && hist.Body["refusals"].(map[string]any)["not_admitted"] != nil {
			break
		}
	}
	if hist.Status != 200 || hist.Body["accepted"].(float64) < 1 || hist.Body["bot_refusals"] == nil || hist.Body["queue_peak"] == nil ||
		hist.Body["tag"] != "crowd-sales" {
		t.Fatalf("history of the crowd sale: %d %s", hist.Status, hist.Raw)
	}
	c.call(200, true, "POST", "/admin/v1/history/crowd", "", admin) // idempotent: a refresh
	c.call(201, true, "PUT", "/admin/v1/skus/later", `{"stock":5,"per_user_limit":1,"starts_at":"2999-01-01T00:00:00Z"}`, admin)
	if r := c.call(409, true, "POST", "/admin/v1/history/later", "", admin); r.code() != "no_history" {
		t.Fatal(r.Raw)
	}
	patch := "Content-Type: application/merge-patch+json"
	if r := c.call(200, true, "PATCH", "/admin/v1/skus/later", `{"tag":"phones"}`, admin, patch); r.Body["tag"] != "phones" {
		t.Fatal(r.Raw)
	}
	c.call(400, false, "PATCH", "/admin/v1/skus/later", `{"tag":"no spaces"}`, admin, patch)
	c.call(400, false, "PUT", "/admin/v1/skus/later", `{"stock":5,"per_user_limit":1,"tag":"`+strings.Repeat("t", 65)+`"}`, admin)
	if r := c.call(200, true, "PATCH", "/admin/v1/skus/later", `{"tag":null}`, admin, patch); r.Body["tag"] != "" {
		t.Fatal(r.Raw)
	}
	c.call(404, true, "POST", "/admin/v1/history/nope", "", admin)
	c.call(400, false, "POST", "/admin/v1/history/bad!id", "", admin)
	c.call(401, true, "POST", "/admin/v1/history/crowd", "")
	c.call(400, false, "GET", "/admin/v1/history?limit=0", "", admin)
	c.call(400, false, "GET", "/admin/v1/history?sku_id=bad!id", "", admin)
	c.call(401, true, "GET", "/admin/v1/history", "")
	if r := c.call(200, true, "GET", "/admin/v1/history?sku_id=crowd&limit=5", "", admin); len(r.Body["sales"].([]any)) != 1 {
		t.Fatalf("history of crowd: %s", r.Raw)
	}
	if rows, err := h.a.store.SaleRecords(t.Context(), "", 100); err != nil || len(rows) != 1 {
		t.Fatalf("sale_history after the refusals: %d rows, %v; want the crowd sale's only", len(rows), err)
	}

	// The risk lists: a listed buyer is refused by the purchase path within a second.
	e := c.call(201, true, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"mallory","reason":"contract test"}`, admin)
	c.call(200, true, "GET", "/admin/v1/risk", "", admin)
	var blocked reply
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if blocked = h.buy("mallory", "c", 1, ""); blocked.code() == "blocked" {
			break
		}
	}
	if blocked.Status != http.StatusForbidden || blocked.code() != "blocked" {
		t.Fatalf("a listed buyer's purchase: %d %s", blocked.Status, blocked.Raw)
	}
	c.call(200, true, "DELETE", fmt.Sprintf("/admin/v1/risk/%d", int64(e.Body["id"].(float64))), "", admin)

	// Every operation of the spec was seen answering.
	for path, item := range c.doc.Paths.Map() {
		for method := range item.Operations() {
			seen := false
			for k := range c.covered {
				if strings.HasPrefix(k, method+" "+path+" ") {
					seen = true
				}
			}
			if !seen {
				t.Errorf("%s %s: never called", method, path)
			}
		}
	}
}

// TestOpenAPIContractRefusals covers the refusals that need another
// configuration: the admin API and the payment callback switched off (403),
// and the instance's rate limit (429, Retry-After).
func TestOpenAPIContractRefusals(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded", "FLASHSALE_ADMIN_TOKEN", "", "FLASHSALE_PAYMENT_SECRET", "",
		"FLASHSALE_RATE_LIMIT_INSTANCE", "0.001", "FLASHSALE_RATE_LIMIT_INSTANCE_BURST", "1"))
	c := newContract(t, h)
	admin := "Authorization: Bearer anything"
	if r := c.call(403, true, "PUT", "/admin/v1/skus/c", `{"stock":1,"per_user_limit":1}`, admin); r.code() != "admin_disabled" {
		t.Fatal(r.Raw)
	}
	c.call(403, true, "PATCH", "/admin/v1/skus/c", `{"stock":1}`, admin, "Content-Type: application/merge-patch+json")
	c.call(403, true, "POST", "/admin/v1/skus/c/restock", `{"delta":1}`, admin)
	c.call(403, true, "GET", "/admin/v1/overview", "", admin)
	if r := c.call(403, true, "POST", "/api/v1/payments/callback", `{"order_id":"x"}`, "X-Flashsale-Signature: sha256=00"); r.code() != "callback_disabled" {
		t.Fatal(r.Raw)
	}
	c.call(404, true, "GET", "/api/v1/skus/c", "") // the one request of the burst
	if r := c.call(429, true, "GET", "/api/v1/skus/c", ""); r.code() != "rate_limited" {
		t.Fatal(r.Raw)
	}
	c.call(429, true, "POST", "/api/v1/orders", `{"sku_id":"c"}`, "Authorization: Bearer "+userToken(t, "u"))
}
