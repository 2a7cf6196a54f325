package apply_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/apply"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// msg is a delivered message; it records what the consumer did with it.
type msg struct {
	jetstream.Msg // nil: only the methods below are used
	data          []byte
	delivered     uint64
	acked, termed bool
	naks          int
}

func (m *msg) Data() []byte    { return m.data }
func (m *msg) Subject() string { return "flashsale.orders.s" }
func (m *msg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{NumDelivered: m.delivered}, nil
}
func (m *msg) Ack() error                       { m.acked = true; return nil }
func (m *msg) NakWithDelay(time.Duration) error { m.naks++; return nil }
func (m *msg) TermWithReason(string) error      { m.termed = true; return nil }

// store fails every apply with err, or succeeds when err is nil.
type store struct {
	mu  sync.Mutex
	err error
}

func (s *store) ApplyBatch(_ context.Context, rs []sale.Reservation) ([]orderstore.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	out := make([]orderstore.Outcome, len(rs))
	for i, r := range rs {
		out[i] = orderstore.Outcome{OrderID: r.OrderID, Status: sale.StatusPendingPayment}
	}
	return out, nil
}
func (s *store) Ping(context.Context) error { return nil }

type gate struct{}

func (gate) Finalize(context.Context, string, []stockgate.Outcome) (int64, error) { return 0, nil }

type dead struct{ n int }

func (d *dead) DeadLetter(context.Context, jetstream.Msg, string, string, string) error {
	d.n++
	return nil
}

// TestTransientNeverDeadLetters: a message whose apply keeps failing with a
// transient error is nak'ed however many times it is delivered; one that
// fails deterministically is dead-lettered at its MaxDeliver-th failure, and
// a success clears the count.
func TestTransientNeverDeadLetters(t *testing.T) {
	reset := fmt.Errorf("orderstore: apply batch of 1: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)})
	poison := fmt.Errorf("orderstore: apply batch of 1: %w", &pgconn.PgError{Code: "P0001", Message: "poison"})
	r := sale.Reservation{OrderID: "01890000-0000-7000-8000-000000000001", SKU: "s", User: "u", Quantity: 1, AcceptedAt: 1}
	data, _ := json.Marshal(r)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	for _, tt := range []struct {
		name     string
		err      error
		wantDead bool
	}{
		{"connection reset", reset, false},
		{"deadline", context.DeadlineExceeded, false},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, false},
		{"trigger refuses", poison, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, dl := &store{err: tt.err}, &dead{}
			c := apply.New(st, gate{}, dl, log, nil, apply.Config{MaxDeliver: 3, Backoff: []time.Duration{time.Millisecond}})
			m := &msg{data: data}
			for i := 1; i <= 10 && !m.termed; i++ {
				m.delivered = uint64(i)
				c.Handle(context.Background(), []jetstream.Msg{m})
			}
			if tt.wantDead {
				if !m.termed || dl.n != 1 || m.naks != 2 {
					t.Fatalf("deterministic failure: termed %v, dead letters %d, naks %d; want dead-lettered at the 3rd failure", m.termed, dl.n, m.naks)
				}
				return
			}
			if m.termed || dl.n != 0 || m.naks != 10 {
				t.Fatalf("transient failure: termed %v, dead letters %d, naks %d; want 10 naks and no dead letter", m.termed, dl.n, m.naks)
			}
		})
	}

	t.Run("success clears the count", func(t *testing.T) {
		st, dl := &store{err: poison}, &dead{}
		c := apply.New(st, gate{}, dl, log, nil, apply.Config{MaxDeliver: 2, Backoff: []time.Duration{time.Millisecond}})
		m := &msg{data: data, delivered: 1}
		c.Handle(context.Background(), []jetstream.Msg{m})
		st.mu.Lock()
		st.err = nil
		st.mu.Unlock()
		c.Handle(context.Background(), []jetstream.Msg{m})
		if !m.acked {
			t.Fatal("not acked once the apply succeeds")
		}
		// A replay of the same order fails once: its earlier failure is forgotten.
		st.mu.Lock()
		st.err = poison
		st.mu.Unlock()
		again := &msg{data: data, delivered: 1}
		c.Handle(context.Background(), []jetstream.Msg{again})
		if again.termed || dl.n != 0 {
			t.Fatal("dead-lettered at its first failure after a success")
		}
	})
}
