package orderqueue_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/flashsale/flashsale/internal/orderqueue"
)

func TestSchemaOf(t *testing.T) {
	for _, tt := range []struct {
		header string // "" = none
		v      int
		ok     bool
	}{{"", 1, true}, {"1", 1, true}, {"2", 2, true}, {"99", 99, true}, {"0", 0, false}, {"-1", 0, false}, {"v2", 0, false}} {
		h := nats.Header{}
		if tt.header != "" {
			h.Set(orderqueue.SchemaHeader, tt.header)
		}
		if v, ok := orderqueue.SchemaOf(h); v != tt.v || ok != tt.ok {
			t.Errorf("SchemaOf(%q) = %d, %v; want %d, %v", tt.header, v, ok, tt.v, tt.ok)
		}
	}
	if v, ok := orderqueue.SchemaOf(nil); v != 1 || !ok {
		t.Errorf("SchemaOf(no headers) = %d, %v; want 1, true", v, ok)
	}
}

// TestPublishedSchema: a published reservation carries SchemaHeader with
// SchemaVersion; its dead letter and the replay of that dead letter keep it.
func TestPublishedSchema(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	ctx := context.Background()
	r := resv("k", 1)
	publishAll(t, q, message(r))
	m := fetch(t, q, 1)[0]
	if got := m.Headers().Get(orderqueue.SchemaHeader); got != "1" {
		t.Fatalf("published %s = %q, want \"1\"", orderqueue.SchemaHeader, got)
	}
	if err := q.DeadLetter(ctx, m, r.OrderID, r.SKU, "test"); err != nil {
		t.Fatal(err)
	}
	if err := m.Term(); err != nil {
		t.Fatal(err)
	}
	ds, err := q.DeadLetters(ctx, 0, 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("dead letters %v, %v; want 1", ds, err)
	}
	if ds[0].Schema != "1" {
		t.Errorf("dead letter schema %q, want \"1\"", ds[0].Schema)
	}
	if err := q.Replay(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
	if got := fetch(t, q, 1)[0].Headers().Get(orderqueue.SchemaHeader); got != "1" {
		t.Errorf("replayed %s = %q, want \"1\"", orderqueue.SchemaHeader, got)
	}
}
