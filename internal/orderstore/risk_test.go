package orderstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// TestRiskEntries: entries are added, listed while live (not removed, not
// expired, by kind), removed once; each add and removal is an audit row
// with its actor, and steps the change counter. Refused input writes
// nothing.
func TestRiskEntries(t *testing.T) {
	s := newStore(t)
	ctx := orderstore.WithActor(testContext(t), orderstore.Actor{Name: "admin", SourceIP: "192.0.2.9"})
	now := time.Date(2031, 1, 2, 3, 4, 5, 678_912_345, time.UTC)
	v0, err := s.RiskVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}

	buyer, err := s.AddRisk(ctx, orderstore.RiskChange{Kind: "buyer", Value: "mallory", Reason: "chargebacks, ticket 12 — 返金"}, now)
	if err != nil {
		t.Fatal(err)
	}
	want := orderstore.RiskEntry{ID: buyer.ID, Kind: "buyer", Value: "mallory", Reason: "chargebacks, ticket 12 — 返金", Source: "admin",
		Actor: "admin", CreatedAt: now.Truncate(time.Microsecond)}
	if d := cmp.Diff(want, buyer); d != "" {
		t.Errorf("added buyer (-want +got):\n%s", d)
	}
	net, err := s.AddRisk(ctx, orderstore.RiskChange{Kind: "ip", Value: "198.51.100.77/24", Reason: "scraper", ExpiresAt: now.Add(time.Hour)}, now)
	if err != nil || net.Value != "198.51.100.0/24" || !net.ExpiresAt.Equal(now.Add(time.Hour).Truncate(time.Microsecond)) {
		t.Fatalf("added prefix %+v, %v", net, err)
	}
	auto, err := s.AddRisk(orderstore.WithActor(ctx, orderstore.Actor{Name: "flashsale"}),
		orderstore.RiskChange{Kind: "ip", Value: "::ffff:203.0.113.5", Reason: "auto: test", Source: "auto", ExpiresAt: now.Add(time.Minute)}, now)
	if err != nil || auto.Value != "203.0.113.5" || auto.Source != "auto" || auto.Actor != "flashsale" {
		t.Fatalf("added auto %+v, %v", auto, err)
	}

	// Refusals: nothing written, the counter unmoved.
	v1, _ := s.RiskVersion(ctx)
	for _, c := range []orderstore.RiskChange{
		{Kind: "user", Value: "x", Reason: "r"},
		{Kind: "buyer", Value: "bad id", Reason: "r"},
		{Kind: "buyer", Value: "", Reason: "r"},
		{Kind: "ip", Value: "10.0.0.0/33", Reason: "r"},
		{Kind: "ip", Value: "fe80::1%eth0", Reason: "r"},
		{Kind: "ip", Value: "example.com", Reason: "r"},
		{Kind: "buyer", Value: "u", Reason: ""},
		{Kind: "buyer", Value: "u", Reason: "   "},
		{Kind: "buyer", Value: "u", Reason: string(make([]rune, 201))},
		{Kind: "buyer", Value: "u", Reason: "line\nbreak"},
		{Kind: "buyer", Value: "u", Reason: "r", Source: "robot"},
		{Kind: "buyer", Value: "u", Reason: "r", ExpiresAt: now},
	} {
		if _, err := s.AddRisk(ctx, c, now); !errors.Is(err, sale.ErrInvalid) {
			t.Errorf("AddRisk(%+v) = %v, want ErrInvalid", c, err)
		}
	}
	if v, _ := s.RiskVersion(ctx); v != v1 || v1 != v0+3 {
		t.Errorf("version %d -> %d -> %d, want +3 then unchanged", v0, v1, v)
	}
	if n := queryInt(t, s, `SELECT count(*) FROM risk_entries`); n != 3 {
		t.Errorf("%d rows after refusals, want 3", n)
	}

	list := func(kind string, at time.Time) []int64 {
		t.Helper()
		es, err := s.RiskEntries(ctx, kind, at)
		if err != nil {
			t.Fatal(err)
		}
		ids := []int64{}
		for _, e := range es {
			ids = append(ids, e.ID)
		}
		return ids
	}
	if d := cmp.Diff([]int64{buyer.ID, net.ID, auto.ID}, list("", now)); d != "" {
		t.Errorf("live entries (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]int64{net.ID, auto.ID}, list("ip", now)); d != "" {
		t.Errorf("ip entries (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]int64{buyer.ID, net.ID}, list("", now.Add(time.Minute))); d != "" {
		t.Errorf("after the auto entry expired (-want +got):\n%s", d)
	}
	if es, err := s.RiskEntries(ctx, "", now); err != nil || !cmp.Equal(es[0], buyer) || !cmp.Equal(es[1], net) {
		t.Errorf("entries as read %+v, %v", es, err)
	}
	if _, err := s.RiskEntries(ctx, "user", now); !errors.Is(err, sale.ErrInvalid) {
		t.Errorf("RiskEntries of kind user: %v", err)
	}

	// Removal: once; the removed entry is returned as it was.
	rctx := orderstore.WithActor(testContext(t), orderstore.Actor{Name: "admin2", SourceIP: "2001:db8::2"})
	got, err := s.RemoveRisk(rctx, net.ID, now.Add(time.Second))
	if err != nil || !cmp.Equal(got, net) {
		t.Fatalf("RemoveRisk = %+v, %v; want %+v", got, err, net)
	}
	if _, err := s.RemoveRisk(rctx, net.ID, now); !errors.Is(err, sale.ErrUnknownRiskEntry) {
		t.Errorf("second removal: %v", err)
	}
	if _, err := s.RemoveRisk(rctx, 999999, now); !errors.Is(err, sale.ErrUnknownRiskEntry) {
		t.Errorf("removal of an unknown id: %v", err)
	}
	if d := cmp.Diff([]int64{buyer.ID, auto.ID}, list("", now)); d != "" {
		t.Errorf("after the removal (-want +got):\n%s", d)
	}
	if v, _ := s.RiskVersion(ctx); v != v1+1 {
		t.Errorf("version %d after one removal from %d", v, v1)
	}

	// The audit trail: three adds and one removal, with actors and addresses.
	as, err := s.RiskAudit(ctx, 0, 100)
	if err != nil || len(as) != 4 {
		t.Fatalf("RiskAudit = %+v, %v", as, err)
	}
	type row struct {
		Entry                          int64
		Action, Kind, Value, Actor, IP string
		Expires                        time.Time
	}
	var rows []row
	for _, a := range as {
		rows = append(rows, row{a.EntryID, a.Action, a.Kind, a.Value, a.Actor, a.SourceIP, a.ExpiresAt})
		if a.At.IsZero() || a.At.Location() != time.UTC || a.Reason == "" || a.Source == "" {
			t.Errorf("audit row %+v", a)
		}
	}
	wantRows := []row{
		{buyer.ID, "add", "buyer", "mallory", "admin", "192.0.2.9", time.Time{}},
		{net.ID, "add", "ip", "198.51.100.0/24", "admin", "192.0.2.9", net.ExpiresAt},
		{auto.ID, "add", "ip", "203.0.113.5", "flashsale", "", auto.ExpiresAt},
		{net.ID, "remove", "ip", "198.51.100.0/24", "admin2", "2001:db8::2", net.ExpiresAt},
	}
	if d := cmp.Diff(wantRows, rows); d != "" {
		t.Errorf("audit rows (-want +got):\n%s", d)
	}
	if page, err := s.RiskAudit(ctx, as[2].ID, 10); err != nil || len(page) != 1 || page[0].ID != as[3].ID {
		t.Errorf("audit page after %d: %+v, %v", as[2].ID, page, err)
	}
}

// TestCanonicalRiskValue: IP values are stored as masked prefixes, single
// addresses without a length, IPv4-mapped IPv6 as IPv4.
func TestCanonicalRiskValue(t *testing.T) {
	tests := []struct{ kind, in, want string }{
		{"ip", "192.0.2.7", "192.0.2.7"},
		{"ip", "192.0.2.7/32", "192.0.2.7"},
		{"ip", "192.0.2.7/24", "192.0.2.0/24"},
		{"ip", "0.0.0.0/0", "0.0.0.0/0"},
		{"ip", "2001:DB8:0:0::1", "2001:db8::1"},
		{"ip", "2001:db8::1/128", "2001:db8::1"},
		{"ip", "2001:db8:1:2::/48", "2001:db8:1::/48"},
		{"ip", "::ffff:192.0.2.7", "192.0.2.7"},
		{"ip", "::ffff:192.0.2.0/120", "192.0.2.0/24"},
		{"buyer", "alice@example.com", "alice@example.com"},
		{"ip", "::ffff:0:0/64", ""},
		{"ip", "192.0.2.256", ""},
		{"ip", " 192.0.2.1", ""},
		{"ip", "", ""},
		{"buyer", "al ice", ""},
		{"buyer", "", ""},
		{"other", "x", ""},
	}
	for _, tt := range tests {
		got, err := orderstore.CanonicalRiskValue(tt.kind, tt.in)
		if got != tt.want || (tt.want == "") != errors.Is(err, sale.ErrInvalid) {
			t.Errorf("CanonicalRiskValue(%q, %q) = %q, %v; want %q", tt.kind, tt.in, got, err, tt.want)
		}
	}
}
