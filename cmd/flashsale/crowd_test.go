package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/altcha"
	"github.com/flashsale/flashsale/internal/fleet"
)

// ticketFor gets user a ticket of sku as the buyer page does: a challenge,
// solved, redeemed. It reports a failure with Errorf and returns "" (it
// runs on goroutines too).
func (h *harness) ticketFor(user, sku string) string {
	h.t.Helper()
	auth := "Authorization: Bearer " + userToken(h.t, user)
	c := h.do(http.MethodGet, "/api/v1/skus/"+sku+"/challenge", "", auth)
	if c.Status != http.StatusOK {
		h.t.Errorf("challenge for %s: %d %s", user, c.Status, c.Raw)
		return ""
	}
	p, _, err := altcha.Solve([]byte(c.Raw), 1<<20)
	if err != nil {
		h.t.Error(err)
		return ""
	}
	r := h.do(http.MethodPost, "/api/v1/skus/"+sku+"/ticket", fmt.Sprintf(`{"payload":%q}`, p), auth)
	if r.Status != http.StatusCreated || r.str("ticket") == "" {
		h.t.Errorf("ticket for %s: %d %s", user, r.Status, r.Raw)
		return ""
	}
	return r.str("ticket")
}

// buyAnswered buys as a client does, sending the same request again (same
// key) while the answer says to retry: 503, or 429 after its Retry-After
// (the per-user limit, 2 a second, is shorter than a busy machine's
// retries), for up to 30 s.
func (h *harness) buyAnswered(user, sku, key string, headers ...string) reply {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := h.buyWith(user, sku, key, headers...)
		switch {
		case time.Now().After(deadline):
			return r
		case r.Status == http.StatusServiceUnavailable:
			time.Sleep(100 * time.Millisecond)
		case r.Status == http.StatusTooManyRequests:
			time.Sleep(time.Second)
		default:
			return r
		}
	}
}

func (h *harness) buyWith(user, sku, key string, headers ...string) reply {
	hdr := append([]string{"Authorization: Bearer " + userToken(h.t, user)}, headers...)
	if key != "" {
		hdr = append(hdr, "Idempotency-Key: "+key)
	}
	return h.do(http.MethodPost, "/api/v1/orders", fmt.Sprintf(`{"sku_id":%q,"quantity":1}`, sku), hdr...)
}

// TestTicketsEndToEnd: a sale with tickets refuses purchases without one
// (403 ticket_required), hands challenges to signed-in buyers, redeems a
// solution once and for its own buyer only, and sells to ticket holders;
// every refusal has its code and changes nothing; the invariants hold in
// the database afterwards.
func TestTicketsEndToEnd(t *testing.T) {
	t.Parallel()
	// A low cost: the test is of the flow, and nine proofs at the default
	// cost take a minute under -race (TestOpenAPIContract solves one at it).
	h := newHarness(t, testConfig(t, "embedded", "FLASHSALE_CHALLENGE_COST", "20"))
	const sku = "TIX"
	if r := h.putSKUAnswered(sku, `{"stock":5,"per_user_limit":1,"ticket_required":true}`); !saved(r) ||
		r.Body["ticket_required"] != true || r.Body["waiting_room"] != false {
		t.Fatalf("put: %d %s", r.Status, r.Raw)
	}
	if r := h.do(http.MethodGet, "/api/v1/skus/"+sku, ""); r.Body["ticket_required"] != true {
		t.Fatalf("the buyer's view of the sale: %s", r.Raw)
	}
	if r := h.buyWith("alice", sku, ""); r.Status != http.StatusForbidden || r.code() != "ticket_required" {
		t.Fatalf("a purchase without a ticket: %d %s", r.Status, r.Raw)
	}
	if r := h.buyWith("alice", sku, "", "Flashsale-Ticket: t1.forged.x"); r.code() != "ticket_required" {
		t.Fatalf("a purchase with a forged ticket: %d %s", r.Status, r.Raw)
	}

	alice, bob := "Authorization: Bearer "+userToken(t, "alice"), "Authorization: Bearer "+userToken(t, "bob")
	c := h.do(http.MethodGet, "/api/v1/skus/"+sku+"/challenge", "", alice)
	if c.Status != http.StatusOK || c.Body["signature"] == nil {
		t.Fatalf("challenge: %d %s", c.Status, c.Raw)
	}
	payload, _, err := altcha.Solve([]byte(c.Raw), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	post := func(auth, body string) reply {
		return h.do(http.MethodPost, "/api/v1/skus/"+sku+"/ticket", body, auth)
	}
	for _, bad := range []struct {
		auth, body string
		status     int
		code       string
	}{
		{alice, `{}`, http.StatusBadRequest, "invalid_request"},
		{alice, `{"payload":""}`, http.StatusBadRequest, "invalid_request"},
		{alice, `{"payload":"%%%"}`, http.StatusBadRequest, "solution_malformed"},
		{alice, `{"payload":1}`, http.StatusBadRequest, "invalid_request"},
		{alice, `{"payload":"x","extra":1}`, http.StatusBadRequest, "invalid_request"},
		{bob, fmt.Sprintf(`{"payload":%q}`, payload), http.StatusForbidden, "challenge_other_buyer"},
		{"X-Anonymous: 1", fmt.Sprintf(`{"payload":%q}`, payload), http.StatusUnauthorized, "unauthenticated"},
	} {
		if r := post(bad.auth, bad.body); r.Status != bad.status || r.code() != bad.code {
			t.Errorf("ticket %s: %d %s; want %d %s", bad.body, r.Status, r.Raw, bad.status, bad.code)
		}
	}
	r := post(alice, fmt.Sprintf(`{"payload":%q}`, payload))
	if r.Status != http.StatusCreated || !strings.HasPrefix(r.str("ticket"), "t1.") {
		t.Fatalf("redeem: %d %s", r.Status, r.Raw)
	}
	tk := r.str("ticket")
	// Sent again by its buyer (an answer lost): the same ticket, 200.
	if r := post(alice, fmt.Sprintf(`{"payload":%q}`, payload)); r.Status != http.StatusOK || r.str("ticket") != tk {
		t.Fatalf("second redeem: %d %s", r.Status, r.Raw)
	}
	// A wrong solution spends its challenge: the right one after it is 409.
	c2 := h.do(http.MethodGet, "/api/v1/skus/"+sku+"/challenge", "", alice)
	right, _, err := altcha.Solve([]byte(c2.Raw), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	wrong := wrongSolution(t, right)
	if r := post(alice, fmt.Sprintf(`{"payload":%q}`, wrong)); r.Status != http.StatusForbidden || r.code() != "solution_wrong" {
		t.Fatalf("a wrong solution: %d %s", r.Status, r.Raw)
	}
	if r := post(alice, fmt.Sprintf(`{"payload":%q}`, right)); r.Status != http.StatusConflict || r.code() != "challenge_used" {
		t.Fatalf("the right solution after a wrong one: %d %s", r.Status, r.Raw)
	}
	if r := h.buyWith("bob", sku, "", "Flashsale-Ticket: "+tk); r.code() != "ticket_required" {
		t.Fatalf("bob with alice's ticket: %d %s", r.Status, r.Raw)
	}
	bought := h.buyAnswered("alice", sku, "k-alice", "Flashsale-Ticket: "+tk)
	if bought.Status != http.StatusAccepted {
		t.Fatalf("alice with her ticket: %d %s", bought.Status, bought.Raw)
	}
	ids := []string{}
	var mu sync.Mutex
	retry := h.buyAnswered("alice", sku, "k-alice", "Flashsale-Ticket: "+tk)
	if (retry.Status != http.StatusAccepted && retry.Status != http.StatusOK) || retry.str("order_id") != bought.str("order_id") {
		t.Fatalf("alice's retry: %d %s; first answer %s", retry.Status, retry.Raw, bought.Raw)
	}
	ids = append(ids, bought.str("order_id"))

	// Eight more buyers get tickets and buy at once: four units are left.
	var wg sync.WaitGroup
	codes := map[string]int{}
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := fmt.Sprintf("buyer%d", i)
			tk := h.ticketFor(u, sku)
			if tk == "" {
				return
			}
			r := h.buyAnswered(u, sku, "k-"+u, "Flashsale-Ticket: "+tk)
			mu.Lock()
			defer mu.Unlock()
			codes[fmt.Sprint(r.Status, r.code())]++
			if r.Status == http.StatusAccepted {
				ids = append(ids, r.str("order_id"))
			}
		}()
	}
	wg.Wait()
	if codes["202"] != 4 || codes["409sold_out"] != 4 {
		t.Errorf("eight ticket holders for four units: %v", codes)
	}

	// A sale without tickets hands out no challenge; a bad setting changes nothing.
	h.mustPutSKU("PLAIN", 1, 1)
	if r := h.do(http.MethodGet, "/api/v1/skus/PLAIN/challenge", "", alice); r.Status != http.StatusConflict || r.code() != "ticket_not_required" {
		t.Errorf("challenge of a sale without tickets: %d %s", r.Status, r.Raw)
	}
	for _, body := range []string{`{"admission_rate":-1}`, `{"ticket_required":"yes"}`, `{"waiting_room":null}`, `{"tickets_open_at":"soon"}`} {
		r := h.do(http.MethodPatch, "/admin/v1/skus/"+sku, body, "Authorization: Bearer "+testAdmin)
		if r.Status != http.StatusBadRequest {
			t.Errorf("patch %s: %d %s", body, r.Status, r.Raw)
		}
	}
	if r := h.do(http.MethodGet, "/admin/v1/skus/"+sku, "", "Authorization: Bearer "+testAdmin); r.Body["ticket_required"] != true || r.Body["admission_rate"] != float64(0) {
		t.Errorf("after refused patches: %s", r.Raw)
	}
	m := h.do(http.MethodGet, "/metrics", "")
	if v := metricValue(m.Raw, "flashsale_challenges_total", `result="solved"`); v != 9 {
		t.Errorf("flashsale_challenges_total{solved} = %v, want 9", v)
	}
	if v := metricValue(m.Raw, "flashsale_tickets_refused_total", `reason="challenge_used"`); v != 1 {
		t.Errorf("flashsale_tickets_refused_total{challenge_used} = %v, want 1", v)
	}
	rep := settle(t, h.a, sku, ids, 30*time.Second)
	if rep.Orders != 5 {
		t.Errorf("%d orders in the database, want 5", rep.Orders)
	}
}

// TestWaitingRoomEndToEnd: buyers who join before the opening wait without
// a place, get a lottery's places at the opening (a permutation of
// 1..n), are admitted as the stock allows, and buy with their admission;
// once the stock is gone every buyer still waiting is told sold_out. A
// purchase without an admission is 403 not_admitted. The invariants hold
// in the database.
func TestWaitingRoomEndToEnd(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded"))
	const sku, buyers, stock = "ROOM", 8, 3
	// The joins all come before the opening: the sale opens in an hour,
	// and is moved to open now once everyone joined (a fixed few seconds
	// ran out on a starved CI machine between a buyer's two joins).
	opens := time.Now().Add(time.Hour).UTC()
	r := h.putSKUAnswered(sku, fmt.Sprintf(`{"stock":%d,"per_user_limit":1,"waiting_room":true,"admission_rate":1000,"starts_at":%q}`, stock, opens.Format(time.RFC3339Nano)))
	if !saved(r) {
		t.Fatalf("put: %d %s", r.Status, r.Raw)
	}
	auth := func(u string) string { return "Authorization: Bearer " + userToken(t, u) }
	for i := range buyers {
		u := fmt.Sprintf("w%d", i)
		j := h.do(http.MethodPost, "/api/v1/skus/"+sku+"/queue", "", auth(u))
		if j.Status != http.StatusCreated || j.str("state") != "waiting" || j.Body["position"] != float64(0) {
			t.Fatalf("%s joins before the opening: %d %s", u, j.Status, j.Raw)
		}
		if again := h.do(http.MethodPost, "/api/v1/skus/"+sku+"/queue", "", auth(u)); again.Status != http.StatusCreated || again.Body["position"] != float64(0) {
			t.Fatalf("%s joins again: %s, first %s", u, again.Raw, j.Raw)
		}
	}
	if r := h.do(http.MethodGet, "/api/v1/skus/"+sku+"/queue", "", auth("stranger")); r.Status != http.StatusNotFound || r.code() != "not_in_queue" {
		t.Fatalf("a poll without joining: %d %s", r.Status, r.Raw)
	}
	now := time.Now().UTC()
	if r := h.doUntilAnswered(http.MethodPatch, "/admin/v1/skus/"+sku, fmt.Sprintf(`{"starts_at":%q}`, now.Format(time.RFC3339Nano)),
		"Authorization: Bearer "+testAdmin, "Content-Type: application/merge-patch+json"); r.Status != http.StatusOK {
		t.Fatalf("opening the sale now: %d %s", r.Status, r.Raw)
	}

	var mu sync.Mutex
	positions := map[int]bool{}
	final := map[string]int{}
	var ids []string
	var wg sync.WaitGroup
	for i := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := fmt.Sprintf("w%d", i)
			seen := false
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
				p := h.do(http.MethodGet, "/api/v1/skus/"+sku+"/queue", "", auth(u))
				switch p.str("state") {
				case "waiting":
					if pos := int(p.Body["position"].(float64)); pos > 0 && !seen {
						seen = true
						mu.Lock()
						positions[pos] = true
						mu.Unlock()
					}
					time.Sleep(min(time.Duration(p.Body["poll_after_ms"].(float64))*time.Millisecond, 300*time.Millisecond))
					continue
				case "admitted":
					if !seen { // admitted at its first poll: its place is below served
						seen = true
					}
					if b := h.buyWith(u, sku, "", "Flashsale-Admission: nonsense"); b.code() != "not_admitted" {
						t.Errorf("%s buys with a bad admission: %d %s", u, b.Status, b.Raw)
					}
					b := h.buyAnswered(u, sku, "k-"+u, "Flashsale-Admission: "+p.str("admission"))
					mu.Lock()
					final[fmt.Sprint("bought ", b.Status, b.code())]++
					if b.Status == http.StatusAccepted {
						ids = append(ids, b.str("order_id"))
					}
					mu.Unlock()
					return
				case "sold_out":
					mu.Lock()
					final["sold_out"]++
					mu.Unlock()
					return
				default:
					if p.Status == http.StatusServiceUnavailable {
						time.Sleep(100 * time.Millisecond)
						continue
					}
					t.Errorf("%s polls: %d %s", u, p.Status, p.Raw)
					return
				}
			}
			t.Errorf("%s: no admission or sold_out within 60 s", u)
		}()
	}
	wg.Wait()
	if final["bought 202"] != stock || final["sold_out"]+final["bought 202"]+final["bought 409sold_out"] != buyers {
		t.Errorf("outcomes %v: want %d bought, the rest sold out", final, stock)
	}
	for p := range positions {
		if p < 1 || p > buyers {
			t.Errorf("place %d outside the lottery's 1..%d (%v)", p, buyers, positions)
		}
	}
	if r := h.buyWith("w0", sku, ""); r.Status != http.StatusForbidden || r.code() != "not_admitted" {
		t.Errorf("a purchase without an admission: %d %s", r.Status, r.Raw)
	}
	m := h.do(http.MethodGet, "/metrics", "")
	if v := metricValue(m.Raw, "flashsale_room_events_total", `event="joined"`); v < buyers {
		t.Errorf("flashsale_room_events_total{joined} = %v, want at least %d", v, buyers)
	}
	rep := settle(t, h.a, sku, ids, 30*time.Second)
	if rep.Orders != stock {
		t.Errorf("%d orders in the database, want %d", rep.Orders, stock)
	}
}

// TestCrowdSettingsAndRetries: a PATCH turns tickets on and off (and is
// refused, changing nothing, while an instance that does not enforce them
// runs); challenges wait for tickets_open_at; a retry of an
// Idempotency-Key gets its order after its ticket expired and after its
// buyer was listed, while a new purchase is refused.
func TestCrowdSettingsAndRetries(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded", "FLASHSALE_CHALLENGE_COST", "20", "FLASHSALE_TICKET_TTL", "1s"))
	admin := "Authorization: Bearer " + testAdmin
	patch := func(sku, body string) reply {
		return h.do(http.MethodPatch, "/admin/v1/skus/"+sku, body, admin, "Content-Type: application/merge-patch+json")
	}
	h.mustPutSKU("P", 10, 1)
	// An instance of a release that does not enforce tickets.
	ctx := context.Background()
	if err := h.a.fleet.Beat(ctx, fleet.Instance{ID: "old-1", Version: "v0", Group: "stable", StartedAt: time.Now()}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if r := patch("P", `{"ticket_required":true}`); r.Status != http.StatusConflict || r.code() != "fleet_not_ready" || !strings.Contains(r.Raw, "old-1") {
		t.Fatalf("tickets on beside an old instance: %d %s", r.Status, r.Raw)
	}
	if r := h.putSKU("Q", `{"stock":1,"per_user_limit":1,"waiting_room":true}`); r.code() != "fleet_not_ready" {
		t.Fatalf("a room sale created beside an old instance: %d %s", r.Status, r.Raw)
	}
	if err := h.a.fleet.Leave(ctx, "old-1"); err != nil {
		t.Fatal(err)
	}
	r := patch("P", `{"ticket_required":true,"admission_rate":7}`)
	if r.Status != http.StatusOK || r.Body["ticket_required"] != true || r.Body["admission_rate"] != float64(7) {
		t.Fatalf("patch tickets on: %d %s", r.Status, r.Raw)
	}
	if r := h.buyWith("amy", "P", ""); r.code() != "ticket_required" {
		t.Fatalf("a purchase once tickets are on: %d %s", r.Status, r.Raw)
	}

	// A ticket, an order, then the ticket expires (FLASHSALE_TICKET_TTL 1s).
	tk := h.ticketFor("amy", "P")
	first := h.buyAnswered("amy", "P", "k-amy", "Flashsale-Ticket: "+tk)
	if first.Status != http.StatusAccepted {
		t.Fatalf("amy buys: %d %s", first.Status, first.Raw)
	}
	time.Sleep(1200 * time.Millisecond)
	if r := h.buyAnswered("amy", "P", "k-amy", "Flashsale-Ticket: "+tk); r.str("order_id") != first.str("order_id") {
		t.Fatalf("amy's retry with her expired ticket: %d %s; want order %s", r.Status, r.Raw, first.str("order_id"))
	}
	if r := h.buyWith("amy", "P", "k-amy-2", "Flashsale-Ticket: "+tk); r.code() != "ticket_required" {
		t.Fatalf("a new purchase with the expired ticket: %d %s", r.Status, r.Raw)
	}

	// Turned off again, anyone buys; then amy is listed: her retry still
	// gets her order, a new purchase is refused.
	if r := patch("P", `{"ticket_required":false}`); r.Status != http.StatusOK || r.Body["ticket_required"] != false {
		t.Fatalf("patch tickets off: %d %s", r.Status, r.Raw)
	}
	if r := h.buyAnswered("bea", "P", "k-bea"); r.Status != http.StatusAccepted {
		t.Fatalf("bea buys without a ticket: %d %s", r.Status, r.Raw)
	}
	if r := h.do(http.MethodPost, "/admin/v1/risk", `{"kind":"buyer","value":"amy","reason":"test"}`, admin); r.Status != http.StatusCreated {
		t.Fatalf("list amy: %d %s", r.Status, r.Raw)
	}
	var blocked reply
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if blocked = h.buyWith("amy", "P", "k-amy-3"); blocked.code() == "blocked" {
			break
		}
	}
	if blocked.code() != "blocked" {
		t.Fatalf("a listed buyer's new purchase: %d %s", blocked.Status, blocked.Raw)
	}
	if r := h.buyAnswered("amy", "P", "k-amy"); r.str("order_id") != first.str("order_id") {
		t.Fatalf("a listed buyer's retry: %d %s; want order %s", r.Status, r.Raw, first.str("order_id"))
	}

	// Tickets open at tickets_open_at, not before.
	later := time.Now().Add(time.Hour).UTC()
	if r := h.putSKUAnswered("T", fmt.Sprintf(`{"stock":1,"per_user_limit":1,"ticket_required":true,"tickets_open_at":%q,"starts_at":%q}`,
		later.Format(time.RFC3339), later.Add(time.Minute).Format(time.RFC3339))); !saved(r) {
		t.Fatalf("put T: %d %s", r.Status, r.Raw)
	}
	if r := h.do(http.MethodGet, "/api/v1/skus/T/challenge", "", "Authorization: Bearer "+userToken(t, "cat")); r.Status != http.StatusConflict || r.code() != "tickets_not_open" {
		t.Fatalf("a challenge before tickets open: %d %s", r.Status, r.Raw)
	}
	if r := patch("T", `{"tickets_open_at":"2999-01-01T00:00:00Z"}`); r.Status != http.StatusBadRequest {
		t.Fatalf("tickets_open_at after starts_at: %d %s", r.Status, r.Raw)
	}
	settle(t, h.a, "P", []string{first.str("order_id")}, 30*time.Second)
}

// wrongSolution is payload with its derived key replaced: authentic, not solved.
func wrongSolution(t *testing.T, payload string) string {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["solution"].(map[string]any)["derivedKey"] = strings.Repeat("0", 64)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}
