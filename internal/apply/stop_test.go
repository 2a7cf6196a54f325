package apply_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/apply"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// stuckStore holds its first batch until the consumer stops (a stop in
// the middle of a batch), and counts what it applies after.
type stuckStore struct {
	countingStore
	stuck chan struct{}
	first bool
}

func (s *stuckStore) ApplyBatch(ctx context.Context, rs []sale.Reservation) ([]orderstore.Outcome, error) {
	s.mu.Lock()
	first := !s.first
	s.first = true
	s.mu.Unlock()
	if first {
		close(s.stuck)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.countingStore.ApplyBatch(ctx, rs)
}

// TestStopHandsMessagesBack: a consumer that stops (an instance draining
// on SIGTERM) hands back at once every message it was delivered and did
// not apply: the batch in hand, and those its pull had buffered. Before,
// the buffered ones were dropped and waited out the consumer's ack wait
// (30 s as the previous release sets it) before another instance got
// them: a rolling upgrade's roll-back waited that long for its orders.
func TestStopHandsMessagesBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ackWait = 30 * time.Second
	q := openQueue(ctx, t, ackWait)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// One worker, batches of 4: its pull buffers up to 8 more. Whether
	// the stop finds messages in the buffer depends on the moment it comes:
	// ten stops.
	// A backoff longer than the test: the batch held when the stop came
	// must be handed back at once too, not after it.
	cfg := apply.Config{Workers: 1, Batch: 4, AckWait: ackWait, Backoff: []time.Duration{time.Minute}}
	const rounds, n = 10, 16
	var longest time.Duration
	for round := range rounds {
		var ids []string
		for i := range n {
			r := sale.Reservation{OrderID: fmt.Sprintf("01890000-0000-7000-8000-00000000%02d%02d", round, i), SKU: "s", User: fmt.Sprintf("u%d", i), Quantity: 1, AcceptedAt: 1}
			b, _ := json.Marshal(r)
			if errs := q.Publish(ctx, []orderqueue.Message{{ID: r.OrderID, SKU: r.SKU, Data: b}}); errs[0] != nil {
				t.Fatal(errs[0])
			}
			ids = append(ids, r.OrderID)
		}
		st := &stuckStore{countingStore: countingStore{applied: map[string]int{}}, stuck: make(chan struct{})}
		first := apply.New(st, gate{}, &dead{}, log, nil, cfg)
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			first.Run(rctx, q.Consumer())
		}()
		<-st.stuck
		// The pull's buffer fills while the first batch is held.
		until(t, "the pull to buffer messages", func() bool {
			info, err := q.Consumer().Info(ctx)
			return err == nil && info.NumAckPending >= 8
		})
		rcancel()
		<-done

		start := time.Now()
		second := apply.New(st, gate{}, &dead{}, log, nil, cfg)
		sctx, scancel := context.WithCancel(ctx)
		sdone := make(chan struct{})
		go func() {
			defer close(sdone)
			second.Run(sctx, q.Consumer())
		}()
		until(t, fmt.Sprintf("round %d: all %d messages applied by the next consumer (ack wait %v)", round, n, ackWait), func() bool {
			for _, id := range ids {
				if st.count(id) == 0 {
					return false
				}
			}
			return true
		})
		longest = max(longest, time.Since(start))
		scancel()
		<-sdone
	}
	t.Logf("%d stops: the next consumer applied every message at most %v after the first stopped", rounds, longest.Round(time.Millisecond))
}
