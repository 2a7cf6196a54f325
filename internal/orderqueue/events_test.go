package orderqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/orderqueue"
)

func TestEventType(t *testing.T) {
	t.Parallel()
	for status, want := range map[string]string{
		"pending_payment": "created", "paid": "paid", "cancelled": "cancelled", "failed": "failed",
		"": "", "expired": "",
	} {
		if got := orderqueue.EventType(status); got != want {
			t.Errorf("EventType(%q) = %q, want %q", status, got, want)
		}
	}
}

// TestPublishEvents: events land on their type's subject, de-duplicated by
// event id ("evt-<id>"); a failed publish is an error.
func TestPublishEvents(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	ctx := context.Background()
	cfg := orderqueue.Config{MaxAge: time.Hour}
	if err := q.EnsureEventStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	evs := []orderqueue.Event{
		{ID: 1, Type: "created", Body: map[string]any{"type": "created", "order_id": "a"}},
		{ID: 2, Type: "paid", Body: map[string]any{"type": "paid", "order_id": "a"}},
		{ID: 1, Type: "created", Body: map[string]any{"type": "created", "order_id": "a"}}, // a retry
	}
	if err := q.PublishEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	if err := q.PublishEvents(ctx, evs[:1]); err != nil {
		t.Fatal(err)
	}
	st, err := q.JetStream().Stream(ctx, orderqueue.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAge != time.Hour || info.State.Msgs != 2 {
		t.Fatalf("event stream: max age %v, %d messages; want 1h, 2", info.Config.MaxAge, info.State.Msgs)
	}
	type stored struct{ Subject, MsgID, Data string }
	var got []stored
	for seq := uint64(1); seq <= 2; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, stored{m.Subject, m.Header.Get(jetstream.MsgIDHeader), string(m.Data)})
	}
	want := []stored{
		{orderqueue.EventSubjectPrefix + "created", "evt-1", `{"order_id":"a","type":"created"}`},
		{orderqueue.EventSubjectPrefix + "paid", "evt-2", `{"order_id":"a","type":"paid"}`},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stored events (-want +got):\n%s", diff)
	}

	if err := q.JetStream().DeleteStream(ctx, orderqueue.EventStream); err != nil {
		t.Fatal(err)
	}
	if err := q.PublishEvents(ctx, []orderqueue.Event{{ID: 3, Type: "failed", Body: 1}}); err == nil {
		t.Error("PublishEvents with the event stream gone = nil")
	}
}
