package events_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/events"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

// hungStream is a broker that never answers: it holds each publish until
// its context ends (and, the first time, until checked is closed: the test
// reads the database while the publish is surely held), or takes it when up.
type hungStream struct {
	up        atomic.Bool
	hanging   chan struct{} // closed when a publish is first held
	checked   chan struct{} // the first held publish returns only once closed
	published atomic.Int64
}

func (s *hungStream) PublishEvents(ctx context.Context, evs []orderqueue.Event) error {
	if s.up.Load() {
		s.published.Add(int64(len(evs)))
		return nil
	}
	select {
	case <-s.hanging:
	default:
		close(s.hanging)
		<-s.checked
	}
	<-ctx.Done()
	return ctx.Err()
}

// openTx counts transactions open on s's database by other sessions.
func openTx(t *testing.T, s *orderstore.Store) int {
	t.Helper()
	q := `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`
	if s.Dialect() == orderstore.MySQL {
		q = `SELECT count(*) FROM information_schema.innodb_trx t JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()`
	}
	var n int
	if err := s.DB().QueryRowContext(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHungBrokerHoldsNoTransaction: while the broker hangs, a pass of the
// publisher holds its batch's transaction only up to its deadline, then
// rolls back and returns; no transaction stays open; once the broker is
// back the same events are published (at least once).
func TestHungBrokerHoldsNoTransaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.PutSKU(ctx, orderstore.SKUChange{ID: "ev", TotalStock: 10, PerUserLimit: 1}); err != nil {
		t.Fatal(err)
	}
	var rs []sale.Reservation
	for _, u := range []string{"a", "b", "c"} {
		rs = append(rs, sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: "ev", User: u, Quantity: 1, AcceptedAt: time.Now().UnixMilli()})
	}
	if _, err := s.ApplyBatch(ctx, rs); err != nil {
		t.Fatal(err)
	}

	st := &hungStream{hanging: make(chan struct{}), checked: make(chan struct{})}
	p := events.New(s, st, slog.New(slog.NewTextHandler(io.Discard, nil))).WithTimeout(500 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		_, err := p.RunOnce(ctx)
		done <- err
	}()
	// The publisher is held in the publish until checked is closed, so its
	// transaction stays open however long this takes on a busy machine (it
	// may outlast the publisher's 500 ms). MariaDB's
	// information_schema.innodb_trx is a cache the server refreshes only
	// when it was last read over 100 ms ago, whoever read it (another test,
	// this one's last run): a new transaction shows up there after such a
	// pause, so read at most every 200 ms until it does.
	<-st.hanging
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n := openTx(t, s)
		if n == 1 {
			break
		}
		if n > 1 || time.Now().After(deadline) {
			t.Errorf("%d transactions open while the broker hangs, want the batch's one", n)
			break
		}
	}
	close(st.checked)
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("RunOnce against a hung broker: %v, want a deadline", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("RunOnce still waiting on a hung broker after 20s")
	}
	deadline := time.Now().Add(5 * time.Second)
	// Read no more often than every 200 ms: MariaDB's cache (above) would
	// otherwise never refresh and show the transaction open, or closed,
	// from before.
	for time.Sleep(200 * time.Millisecond); openTx(t, s) != 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d transactions still open after the publish gave up", openTx(t, s))
		}
	}

	st.up.Store(true)
	if n, err := p.RunOnce(ctx); err != nil || n != 3 || st.published.Load() != 3 {
		t.Fatalf("once the broker is back: %d published, %v (stream took %d), want 3", n, err, st.published.Load())
	}
}
