package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/risk"
	"github.com/flashsale/flashsale/internal/sale"
)

// memRisk is a RiskAdmin in memory; it records every change it is asked
// for, refused or not.
type memRisk struct {
	mu      sync.Mutex
	entries []orderstore.RiskEntry
	calls   int
	actors  []orderstore.Actor
}

func (m *memRisk) List(_ context.Context, kind string, now time.Time) ([]orderstore.RiskEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []orderstore.RiskEntry
	for _, e := range m.entries {
		if (kind == "" || e.Kind == kind) && e.Live(now) {
			out = append(out, e)
		}
	}
	return out, nil
}

func (m *memRisk) Add(ctx context.Context, c orderstore.RiskChange, now time.Time) (orderstore.RiskEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	a, _ := ctx.Value(orderstore.ActorKey{}).(orderstore.Actor)
	m.actors = append(m.actors, a)
	e := orderstore.RiskEntry{ID: int64(len(m.entries) + 1), Kind: c.Kind, Value: c.Value, Reason: c.Reason, Source: c.Source,
		Actor: a.Name, CreatedAt: now, ExpiresAt: c.ExpiresAt}
	m.entries = append(m.entries, e)
	return e, nil
}

func (m *memRisk) Remove(_ context.Context, id int64, _ time.Time) (orderstore.RiskEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	for i, e := range m.entries {
		if e.ID == id {
			m.entries = append(m.entries[:i], m.entries[i+1:]...)
			return e, nil
		}
	}
	return orderstore.RiskEntry{}, sale.ErrUnknownRiskEntry
}

func riskServer(m *memRisk, list *risk.List) *Server {
	cfg := Config{AdminToken: "tok", Risk: m}
	if list != nil {
		cfg.Blocklist = list
	}
	return New(nil, nil, slog.New(slog.DiscardHandler), cfg)
}

type answer struct {
	status int
	body   map[string]any
	header http.Header
}

func (a answer) code() string {
	e, _ := a.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func call(s *Server, method, path, body string, headers ...string) answer {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.RemoteAddr = "192.0.2.200:4567"
	r.Header.Set("Authorization", "Bearer tok")
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	a := answer{status: w.Code, header: w.Header()}
	_ = json.Unmarshal(w.Body.Bytes(), &a.body)
	return a
}

// TestRiskAdminRoutes: add, list and remove through the admin API, as the
// admin (actor and address for the audit trail), with canonical values and
// both forms of expiry.
func TestRiskAdminRoutes(t *testing.T) {
	m := &memRisk{}
	s := riskServer(m, nil)
	a := call(s, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"mallory","reason":"chargebacks"}`)
	if a.status != 201 {
		t.Fatalf("add buyer: %d %v", a.status, a.body)
	}
	want := map[string]any{"id": 1.0, "kind": "buyer", "value": "mallory", "reason": "chargebacks", "source": "admin", "actor": "admin",
		"created_at": a.body["created_at"], "expires_at": nil}
	if d := cmp.Diff(want, a.body); d != "" || a.body["created_at"] == nil {
		t.Errorf("added buyer (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]orderstore.Actor{{Name: "admin", SourceIP: "192.0.2.200"}}, m.actors); d != "" {
		t.Errorf("actors (-want +got):\n%s", d)
	}
	before := time.Now()
	a = call(s, "POST", "/admin/v1/risk", `{"kind":"ip","value":"198.51.100.77/24","reason":"scraper","ttl_seconds":600}`)
	exp, _ := time.Parse(time.RFC3339, a.body["expires_at"].(string))
	if a.status != 201 || a.body["value"] != "198.51.100.0/24" || exp.Before(before.Add(599*time.Second)) || exp.After(time.Now().Add(600*time.Second)) {
		t.Fatalf("add prefix with ttl: %d %v", a.status, a.body)
	}
	a = call(s, "POST", "/admin/v1/risk", `{"kind":"ip","value":"::ffff:203.0.113.9","reason":"bot","expires_at":"2999-01-01T00:00:00Z"}`)
	if a.status != 201 || a.body["value"] != "203.0.113.9" || a.body["expires_at"] != "2999-01-01T00:00:00.000Z" {
		t.Fatalf("add mapped address: %d %v", a.status, a.body)
	}
	a = call(s, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"eve","reason":"x","expires_at":null}`)
	if a.status != 201 || a.body["expires_at"] != nil {
		t.Fatalf("add with expires_at null: %d %v", a.status, a.body)
	}

	ids := func(a answer) []float64 {
		var out []float64
		for _, e := range a.body["entries"].([]any) {
			out = append(out, e.(map[string]any)["id"].(float64))
		}
		return out
	}
	if a = call(s, "GET", "/admin/v1/risk", ""); a.status != 200 || !cmp.Equal(ids(a), []float64{1, 2, 3, 4}) {
		t.Errorf("list: %d %v", a.status, a.body)
	}
	if a = call(s, "GET", "/admin/v1/risk?kind=ip", ""); a.status != 200 || !cmp.Equal(ids(a), []float64{2, 3}) {
		t.Errorf("list ip: %d %v", a.status, a.body)
	}

	if a = call(s, "DELETE", "/admin/v1/risk/2", ""); a.status != 200 || a.body["value"] != "198.51.100.0/24" {
		t.Errorf("remove: %d %v", a.status, a.body)
	}
	if a = call(s, "DELETE", "/admin/v1/risk/2", ""); a.status != 404 || a.code() != "unknown_risk_entry" {
		t.Errorf("remove again: %d %v", a.status, a.body)
	}
	if a = call(s, "GET", "/admin/v1/risk/1", ""); a.status != 405 || a.header.Get("Allow") != "DELETE" {
		t.Errorf("GET of an entry: %d %v %v", a.status, a.header, a.body)
	}
	if a = call(s, "GET", "/admin/v1/risk?kind=buyer", ""); a.status != 200 || !cmp.Equal(ids(a), []float64{1, 4}) {
		t.Errorf("list buyers after the removal: %d %v", a.status, a.body)
	}
	empty := riskServer(&memRisk{}, nil)
	if a = call(empty, "GET", "/admin/v1/risk", ""); a.status != 200 || a.body["entries"] == nil || len(a.body["entries"].([]any)) != 0 {
		t.Errorf("an empty list: %d %v", a.status, a.body)
	}
}

// TestRiskAdminRefusals: every bad request is a 4xx with its code, and
// asks the store for nothing.
func TestRiskAdminRefusals(t *testing.T) {
	m := &memRisk{}
	s := riskServer(m, nil)
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	tests := []struct {
		method, path, body string
		headers            []string
		status             int
		code               string
	}{
		{"POST", "/admin/v1/risk", `{"value":"u","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"user","value":"u","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"bad id","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"` + strings.Repeat("u", 129) + `","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"ip","value":"10.0.0.0/33","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"ip","value":"example.com","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"ip","value":"fe80::1%eth0","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"ip","value":"mallory","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":""}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"  "}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"a\u0007b"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"` + strings.Repeat("é", 201) + `"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","ttl_seconds":0}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","ttl_seconds":99999999}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","ttl_seconds":1.5}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","expires_at":"` + past + `"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","expires_at":"tomorrow"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","expires_at":"2999-01-01T00:00:00Z","ttl_seconds":60}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r","why":"x"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","kind":"ip","value":"u","reason":"r"}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `[]`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r"} {}`, nil, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", ``, []string{"Content-Type: application/json"}, 400, "invalid_request"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r"}`, []string{"Content-Type: text/plain"}, 415, "unsupported_media_type"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"` + strings.Repeat("r", 9000) + `"}`, nil, 413, "body_too_large"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r"}`, []string{"Authorization: "}, 401, "unauthenticated"},
		{"POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r"}`, []string{"Authorization: Bearer wrong"}, 401, "unauthenticated"},
		{"GET", "/admin/v1/risk?kind=user", "", nil, 400, "invalid_request"},
		{"GET", "/admin/v1/risk", "", []string{"Authorization: "}, 401, "unauthenticated"},
		{"DELETE", "/admin/v1/risk/abc", "", nil, 400, "invalid_request"},
		{"DELETE", "/admin/v1/risk/0", "", nil, 400, "invalid_request"},
		{"DELETE", "/admin/v1/risk/-1", "", nil, 400, "invalid_request"},
		{"DELETE", "/admin/v1/risk/99999999999999999999", "", nil, 400, "invalid_request"},
		{"DELETE", "/admin/v1/risk/1", "", []string{"Authorization: "}, 401, "unauthenticated"},
		{"PUT", "/admin/v1/risk", `{}`, nil, 405, "method_not_allowed"},
	}
	for _, tt := range tests {
		a := call(s, tt.method, tt.path, tt.body, tt.headers...)
		if a.status != tt.status || a.code() != tt.code {
			t.Errorf("%s %s %.80s: %d %v, want %d %s", tt.method, tt.path, tt.body, a.status, a.body, tt.status, tt.code)
		}
	}
	if m.calls != 0 {
		t.Errorf("the refusals made %d store calls", m.calls)
	}
	off := New(nil, nil, slog.New(slog.DiscardHandler), Config{Risk: m})
	if a := call(off, "POST", "/admin/v1/risk", `{"kind":"buyer","value":"u","reason":"r"}`); a.status != 403 || a.code() != "admin_disabled" || m.calls != 0 {
		t.Errorf("admin API off: %d %v", a.status, a.body)
	}
}

// TestBlocked: a listed buyer, or a request from a listed address, is
// refused 403 blocked with a reference to appeal with, never the reason;
// without a Blocklist nobody is.
func TestBlocked(t *testing.T) {
	list := &risk.List{}
	list.Replace([]orderstore.RiskEntry{
		{ID: 7, Kind: "buyer", Value: "mallory", Reason: "internal note", Source: "admin"},
		{ID: 8, Kind: "ip", Value: "198.51.100.0/24", Reason: "internal note", Source: "auto", ExpiresAt: time.Date(2999, 1, 2, 3, 4, 5, 0, time.UTC)},
	})
	s := riskServer(&memRisk{}, list)
	req := func(addr string) *http.Request {
		r := httptest.NewRequest("POST", "/api/v1/orders", nil)
		r.RemoteAddr = addr
		return r
	}
	tests := []struct {
		user, addr string
		ref        string // "" : not blocked
	}{
		{"mallory", "192.0.2.1:1", "R7"},
		{"alice", "192.0.2.1:1", ""},
		{"alice", "198.51.100.9:1", "R8"},
		{"", "[::ffff:198.51.100.9]:1", "R8"},
		{"alice", "[2001:db8::1]:1", ""},
	}
	for _, tt := range tests {
		err := s.Blocked(req(tt.addr), tt.user)
		if (err != nil) != (tt.ref != "") || (err != nil && !errors.Is(err, sale.ErrBlocked)) {
			t.Errorf("Blocked(%q from %s) = %v, want %q", tt.user, tt.addr, err, tt.ref)
			continue
		}
		if err == nil {
			continue
		}
		w := httptest.NewRecorder()
		writeError(w, req(tt.addr), slog.New(slog.DiscardHandler), err)
		var b errorBody
		_ = json.Unmarshal(w.Body.Bytes(), &b)
		if w.Code != 403 || b.Error.Code != "blocked" || !strings.Contains(b.Error.Message, "reference "+tt.ref) || strings.Contains(b.Error.Message, "internal note") {
			t.Errorf("answer for %q from %s: %d %+v", tt.user, tt.addr, w.Code, b)
		}
		if tt.ref == "R8" && !strings.Contains(b.Error.Message, "until 2999-01-02T03:04:05Z") {
			t.Errorf("an expiring entry's answer names no end: %q", b.Error.Message)
		}
	}
	if err := riskServer(&memRisk{}, nil).Blocked(req("198.51.100.9:1"), "mallory"); err != nil {
		t.Errorf("without a Blocklist: %v", err)
	}
}
