package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/failpoint"
	"github.com/flashsale/flashsale/internal/orderqueue"
)

// streamEvents reads every event in the event stream: "type order_id" -> count.
func streamEvents(t *testing.T, natsURL string) map[string]int {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	st, err := js.Stream(ctx, orderqueue.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := st.Info(ctx)
	got := map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Type    string `json:"type"`
			OrderID string `json:"order_id"`
			ID      int64  `json:"event_id"`
		}
		if err := json.Unmarshal(m.Data, &e); err != nil || e.ID == 0 || m.Subject != "flashsale.events."+e.Type {
			t.Fatalf("event %s %s: %v", m.Subject, m.Data, err)
		}
		got[e.Type+" "+e.OrderID]++
	}
	return got
}

// waitEvents waits until want is exactly what the stream holds.
func waitEvents(t *testing.T, natsURL string, want map[string]int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := streamEvents(t, natsURL)
		same := len(got) == len(want)
		for k, n := range want {
			same = same && got[k] == n
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("events: got %v, want %v", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOrderEvents: created, paid and cancelled events, one per transition,
// also when the publisher dies after publishing and before marking them.
func TestOrderEvents(t *testing.T) {
	t.Parallel()
	env := procEnv(t)
	env["FLASHSALE_FAILPOINTS"] = failpoint.EventsAfterPublishBeforeMark + "=exit"
	p := startProc(t, env)
	h := procClient(t, p.url)
	h.mustPutSKU("ev", 10, 1)
	// The failpoint ends the process once the first order's event is
	// published, which on a busy machine can be before the third purchase
	// is answered: each buyer sends a key, and asks again with it after the
	// restart, as a client whose answer was lost does.
	for i := 0; i < 3; i++ {
		r := h.buy(fmt.Sprintf("u%d", i), "ev", 1, fmt.Sprintf("ev-%d", i))
		if r.Status != http.StatusAccepted && r.Status != 0 {
			t.Fatalf("buy: %d %s", r.Status, r.Raw)
		}
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("failpoint did not end the process")
	}
	if !strings.Contains(p.log(), "failpoint "+failpoint.EventsAfterPublishBeforeMark+" fired") {
		t.Fatalf("failpoint did not fire:\n%s", p.log())
	}
	delete(env, "FLASHSALE_FAILPOINTS")
	p = startProc(t, env)
	h = procClient(t, p.url)
	var ids []string
	for i := 0; i < 3; i++ {
		r := h.buyUntilAnswered(fmt.Sprintf("u%d", i), "ev", 1, fmt.Sprintf("ev-%d", i), 30*time.Second)
		if (r.Status != http.StatusAccepted && r.Status != http.StatusOK) || r.str("order_id") == "" {
			t.Fatalf("buy u%d again with its key: %d %s", i, r.Status, r.Raw)
		}
		ids = append(ids, r.str("order_id"))
	}
	want := map[string]int{}
	for _, id := range ids {
		want["order.created "+id] = 1
	}
	waitEvents(t, env["FLASHSALE_NATS_URL"], want)

	auth := func(u string) string { return "Authorization: Bearer " + userToken(t, u) }
	if r := h.pay("u0", ids[0], ""); r.Status != http.StatusOK {
		t.Fatalf("pay: %d %s", r.Status, r.Raw)
	}
	if r := h.do(http.MethodPost, "/api/v1/orders/"+ids[1]+"/cancel", "", auth("u1")); r.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.Status, r.Raw)
	}
	want["order.paid "+ids[0]] = 1
	want["order.cancelled "+ids[1]] = 1
	waitEvents(t, env["FLASHSALE_NATS_URL"], want)
}
