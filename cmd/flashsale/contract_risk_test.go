package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/risk"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestOpenAPIContractRisk drives the risk lists' admin routes over the
// real database of record (the dialect under test) and checks every
// exchange against api/openapi.yaml, and that no refusal wrote a row or an
// audit row. serve does not wire the routes yet, so the API is built here
// as serve will build it (httpapi.Config.Risk = risk.Admin over the store).
func TestOpenAPIContractRisk(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	store, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	api := httpapi.New(nil, nil, slog.New(slog.DiscardHandler), httpapi.Config{AdminToken: testAdmin, Risk: risk.Admin{Store: store}})
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	c := newContract(t, &harness{t: t, srvURL: srv.URL})
	admin := "Authorization: Bearer " + testAdmin
	rows := func() (entries, audit int) {
		t.Helper()
		for _, q := range []struct {
			sql string
			n   *int
		}{{"SELECT count(*) FROM risk_entries", &entries}, {"SELECT count(*) FROM risk_audit", &audit}} {
			if err := store.DB().QueryRowContext(ctx, q.sql).Scan(q.n); err != nil {
				t.Fatal(err)
			}
		}
		return entries, audit
	}

	r := c.call(201, true, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"mallory","reason":"chargebacks"}`, admin)
	buyer := r.Body["id"]
	r = c.call(201, true, "POST", "/admin/v1/risk", `{"kind":"ip","value":"2001:DB8:1::/48","reason":"scraper","ttl_seconds":600}`, admin)
	if r.str("value") != "2001:db8:1::/48" || r.Body["expires_at"] == nil {
		t.Fatal(r.Raw)
	}
	c.call(201, true, "POST", "/admin/v1/risk", `{"kind":"ip","value":"192.0.2.7","reason":"bot","expires_at":"2999-01-01T00:00:00Z"}`, admin)
	r = c.call(200, true, "GET", "/admin/v1/risk", "", admin)
	if n := len(r.Body["entries"].([]any)); n != 3 {
		t.Fatalf("%d entries: %s", n, r.Raw)
	}
	r = c.call(200, true, "GET", "/admin/v1/risk?kind=buyer", "", admin)
	if n := len(r.Body["entries"].([]any)); n != 1 {
		t.Fatalf("%d buyer entries: %s", n, r.Raw)
	}

	entries, audit := rows()
	// Refusals: the spec says what it can (types, lengths, enums); the
	// server also refuses what it cannot (a value that is no user id or
	// address, an expiry in the past, both forms of expiry).
	c.call(400, false, "POST", "/admin/v1/risk", `{"kind":"user","value":"u","reason":"r"}`, admin)
	c.call(400, false, "POST", "/admin/v1/risk", `{"kind":"buyer","reason":"r"}`, admin)
	c.call(400, false, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u"}`, admin)
	c.call(400, false, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":""}`, admin)
	c.call(400, false, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"`+strings.Repeat("r", 201)+`"}`, admin)
	c.call(400, false, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","ttl_seconds":0}`, admin)
	c.call(400, false, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","color":"red"}`, admin)
	c.call(400, false, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","expires_at":"soon"}`, admin)
	c.call(400, true, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"bad id","reason":"r"}`, admin)
	c.call(400, true, "POST", "/admin/v1/risk", `{"kind":"ip","value":"10.0.0.0/33","reason":"r"}`, admin)
	c.call(400, true, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"   "}`, admin)
	c.call(400, true, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","expires_at":"2001-01-01T00:00:00Z"}`, admin)
	c.call(400, true, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","expires_at":"2999-01-01T00:00:00Z","ttl_seconds":5}`, admin)
	c.call(415, false, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r"}`, admin, "Content-Type: text/plain")
	c.call(413, false, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"`+strings.Repeat("r", 9000)+`"}`, admin)
	c.call(401, true, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r"}`)
	c.call(400, false, "GET", "/admin/v1/risk?kind=user", "", admin)
	c.call(401, true, "GET", "/admin/v1/risk", "")
	c.call(400, false, "DELETE", "/admin/v1/risk/x", "", admin)
	c.call(400, false, "DELETE", "/admin/v1/risk/0", "", admin)
	c.call(404, true, "DELETE", "/admin/v1/risk/999999", "", admin)
	c.call(401, true, "DELETE", fmt.Sprintf("/admin/v1/risk/%v", buyer), "")
	c.call(405, false, "PUT", "/admin/v1/risk", `{}`, admin)
	if e, a := rows(); e != entries || a != audit {
		t.Fatalf("the refusals wrote: %d -> %d entries, %d -> %d audit rows", entries, e, audit, a)
	}

	r = c.call(200, true, "DELETE", fmt.Sprintf("/admin/v1/risk/%v", buyer), "", admin)
	if r.str("value") != "mallory" {
		t.Fatal(r.Raw)
	}
	if r := c.call(404, true, "DELETE", fmt.Sprintf("/admin/v1/risk/%v", buyer), "", admin); r.code() != "unknown_risk_entry" {
		t.Fatal(r.Raw)
	}
	if e, a := rows(); e != entries || a != audit+1 {
		t.Fatalf("after one removal: %d entries (want %d, kept), %d audit rows (want %d)", e, entries, a, audit+1)
	}

	for path, item := range c.doc.Paths.Map() {
		if !strings.HasPrefix(path, "/admin/v1/risk") {
			continue
		}
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
