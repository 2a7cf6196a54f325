package purchase

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/flashsale/flashsale/internal/sale"
)

// outboxGate is a fakeGate whose outbox holds the payloads of unsent.
type outboxGate struct {
	fakeGate
	unsent map[string][]byte
	err    error
	asked  int
}

func (g *outboxGate) Unsent(_ context.Context, sku, _, id string) ([]byte, string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked++
	return g.unsent[id], sku, g.err
}

// streamRelay answers every Publish with err and records what it was given.
type streamRelay struct {
	mu   sync.Mutex
	err  error
	sent []string // bucket/order id/payload
}

func (r *streamRelay) Notify(context.Context, string, string, []byte) {}
func (r *streamRelay) Publish(_ context.Context, bucket, id string, p []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, bucket+"/"+id+"/"+string(p))
	return r.err
}

// TestRetriedKeyInStream: a retry of an Idempotency-Key whose order is
// still in the Redis outbox (its first instance died between the gate and
// the stream) is answered once the stream acknowledged a copy published
// from the outbox's payload, with the order's id as the message id; when
// the stream does not acknowledge, or Redis cannot say, the answer is
// unavailable (unknown outcome, retry the key), never a second order. An
// order no longer in the outbox costs no publish, and with StreamAck off a
// retry is answered as a first attempt is: from Redis.
func TestRetriedKeyInStream(t *testing.T) {
	down := errors.New("stream down")
	for _, tc := range []struct {
		name     string
		inBox    bool
		redisErr error
		pubErr   error
		ack      time.Duration
		wantErr  error
		wantSent bool
	}{
		{name: "in the outbox, stream acks", inBox: true, ack: time.Second, wantSent: true},
		{name: "in the outbox, stream down", inBox: true, pubErr: down, ack: time.Second, wantSent: true, wantErr: sale.ErrUnavailable},
		{name: "redis cannot say", redisErr: errors.New("timeout"), ack: time.Second, wantErr: sale.ErrUnavailable},
		{name: "already in the stream", ack: time.Second},
		{name: "stream ack off", inBox: true, ack: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &outboxGate{fakeGate: fakeGate{avail: 1}, unsent: map[string][]byte{}}
			rel := &streamRelay{}
			s, _ := newTestService(t, &g.fakeGate, Limits{SoldOutTTL: time.Hour})
			s.gate, s.relay, s.ack = g, rel, tc.ack
			ctx := context.Background()
			req := Request{User: "a", SKU: "s", Quantity: 1, IdempotencyKey: "k1"}
			first, err := s.Buy(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			rel.sent = nil
			if tc.inBox {
				g.unsent[first.OrderID] = []byte("payload")
			}
			g.err, rel.err = tc.redisErr, tc.pubErr
			// The SKU is sold out now: the retry is answered by the key look-up.
			got, err := s.Buy(ctx, req)
			if !errors.Is(err, tc.wantErr) || (err == nil && (got.OrderID != first.OrderID || !got.Duplicate)) {
				t.Fatalf("retry: %+v %v, want order %s or %v", got, err, first.OrderID, tc.wantErr)
			}
			var want []string
			if tc.wantSent {
				want = []string{"s/" + first.OrderID + "/payload"}
			}
			if diff := cmp.Diff(want, rel.sent); diff != "" {
				t.Fatalf("published (-want +got):\n%s", diff)
			}
			if g.avail != 0 {
				t.Fatalf("available %d, want 0: the retry reserved nothing", g.avail)
			}
		})
	}
}
