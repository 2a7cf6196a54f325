package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// fakeAPI is a flash sale in memory behind the HTTP API's routes: enough
// to test what the scenarios send.
type fakeAPI struct {
	mu        sync.Mutex
	stock     map[string]int64
	byKey     map[string]string // user|key -> order
	holds     map[string]int64  // user|sku -> units
	next      int
	lifecycle bool
	settled   map[string]string // order -> paid/cancelled
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	reply := func(status int, body string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}
	user := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ") // the token stands in for the user
	switch {
	case r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/admin/v1/skus/"):
		var b struct{ Stock int64 }
		_ = json.NewDecoder(r.Body).Decode(&b)
		f.stock[strings.TrimPrefix(r.URL.Path, "/admin/v1/skus/")] = b.Stock
		reply(201, `{}`)
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/orders":
		var b struct {
			SKU string `json:"sku_id"`
		}
		_ = json.NewDecoder(r.Body).Decode(&b)
		if id, ok := f.byKey[user+"|"+r.Header.Get("Idempotency-Key")]; ok {
			reply(202, `{"order_id":"`+id+`","status":"queued"}`)
			return
		}
		switch {
		case f.holds[user+"|"+b.SKU] >= 1:
			reply(409, `{"error":{"code":"limit_reached"}}`)
		case f.stock[b.SKU] < 1:
			reply(409, `{"error":{"code":"sold_out"}}`)
		default:
			f.next++
			id := fmt.Sprintf("00000000-0000-7000-8000-%012d", f.next)
			f.byKey[user+"|"+r.Header.Get("Idempotency-Key")] = id
			f.holds[user+"|"+b.SKU]++
			f.stock[b.SKU]--
			reply(202, `{"order_id":"`+id+`","status":"queued"}`)
		}
	case f.lifecycle && strings.HasSuffix(r.URL.Path, "/pay"), f.lifecycle && strings.HasSuffix(r.URL.Path, "/cancel"):
		id := strings.Split(r.URL.Path, "/")[4]
		if !strings.HasPrefix(id, "00000000-0000-7000-8000-0000") || strings.HasSuffix(id, "-000000000000") {
			reply(404, `{"error":{"code":"order_not_found"}}`)
			return
		}
		f.settled[id] = r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
		reply(200, `{}`)
	default:
		reply(404, `{"error":{"code":"not_found"}}`)
	}
}

func newFakeAPI(t *testing.T, lifecycle bool) (*fakeAPI, *Client) {
	f := &fakeAPI{stock: map[string]int64{}, byKey: map[string]string{}, holds: map[string]int64{}, settled: map[string]string{}, lifecycle: lifecycle}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := NewClient(srv.URL, "admin", "secret", 4)
	if err != nil {
		t.Fatal(err)
	}
	c.sign = func(user string) string { return user }
	return f, c
}

// TestLoadgenScenarioClicks: 14 requests are 10 buyers, 2 double clicks
// (same order again) and 2 second purchases (refused at a limit of 1).
func TestLoadgenScenarioClicks(t *testing.T) {
	_, c := newFakeAPI(t, false)
	sc, err := NewScenario(ScenarioConfig{Name: Hot, Stock: 100, RunID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := sc.Setup(ctx, c); err != nil {
		t.Fatal(err)
	}
	op := sc.Op(c)
	codes := map[string]int{}
	for seq := int64(0); seq < 14; seq++ {
		codes[op(ctx, seq).Code]++
	}
	if codes["accepted"] != 12 || codes["limit_reached"] != 2 || len(codes) != 2 {
		t.Errorf("answers %v, want 12 accepted (10 + 2 double clicks), 2 limit_reached", codes)
	}
	if got := len(sc.Accepted()[sc.SKUs()[0]]); got != 10 {
		t.Errorf("%d distinct accepted orders, want 10", got)
	}
}

func TestLoadgenScenarioStormAndMany(t *testing.T) {
	f, c := newFakeAPI(t, false)
	ctx := context.Background()
	storm, _ := NewScenario(ScenarioConfig{Name: Storm, Stock: 50, RunID: "s"})
	if err := storm.Setup(ctx, c); err != nil {
		t.Fatal(err)
	}
	if f.stock[storm.SKUs()[0]] != 0 || len(storm.Accepted()[storm.SKUs()[0]]) != 50 {
		t.Errorf("storm setup left stock %d, %d accepted; want sold out, 50", f.stock[storm.SKUs()[0]], len(storm.Accepted()[storm.SKUs()[0]]))
	}
	if out := storm.Op(c)(ctx, 0); out.Code != "sold_out" || out.Err {
		t.Errorf("after the sell-out: %+v", out)
	}
	many, _ := NewScenario(ScenarioConfig{Name: Many, Stock: 30, SKUs: 3, RunID: "m"})
	if err := many.Setup(ctx, c); err != nil {
		t.Fatal(err)
	}
	op := many.Op(c)
	for seq := int64(0); seq < 21; seq++ {
		op(ctx, seq)
	}
	for _, sku := range many.SKUs() {
		if n := len(many.Accepted()[sku]); n == 0 || f.stock[sku] != 10-int64(n) {
			t.Errorf("%s: %d accepted, stock %d", sku, n, f.stock[sku])
		}
	}
}

func TestLoadgenScenarioMix(t *testing.T) {
	for _, lifecycle := range []bool{true, false} {
		f, c := newFakeAPI(t, lifecycle)
		sc, _ := NewScenario(ScenarioConfig{Name: Mix, Stock: 100, RunID: "x"})
		ctx := context.Background()
		if err := sc.Setup(ctx, c); err != nil {
			t.Fatal(err)
		}
		codes := map[string]int{}
		for seq := int64(0); seq < 40; seq++ {
			codes[sc.Op(c)(ctx, seq).Code]++
		}
		if lifecycle && (codes["paid"] == 0 || codes["cancelled"] == 0 || len(f.settled) != codes["paid"]+codes["cancelled"]) {
			t.Errorf("with the lifecycle routes: answers %v, settled %d", codes, len(f.settled))
		}
		if !lifecycle && (codes["paid"]+codes["cancelled"] != 0 || !strings.Contains(sc.Note, "pay")) {
			t.Errorf("without them: answers %v, note %q", codes, sc.Note)
		}
	}
}

func TestLoadgenCheckLoopback(t *testing.T) {
	for target, ok := range map[string]bool{
		"http://127.0.0.1:8080": true, "http://127.9.9.9": true, "http://[::1]:80": true, "http://localhost:1": true,
		"http://10.0.0.1": false, "http://example.com": false, "https://127.0.0.1": false, "http://localhost.evil.com": false,
		"http://0.0.0.0:8080": false, "ftp://127.0.0.1": false, "127.0.0.1:8080": false,
	} {
		if err := CheckLoopback(target); (err == nil) != ok {
			t.Errorf("CheckLoopback(%q) = %v, want ok %v", target, err, ok)
		}
	}
}
