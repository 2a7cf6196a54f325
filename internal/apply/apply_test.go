package apply_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
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
	seq           uint64 // stream sequence
	acked, termed bool
	naks          int
	progress      atomic.Int64 // in-progress acks (sent from the consumer's keep-alive goroutine)
}

func (m *msg) Data() []byte         { return m.data }
func (m *msg) Headers() nats.Header { return nil }
func (m *msg) Subject() string      { return "flashsale.orders.s" }
func (m *msg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{NumDelivered: m.delivered, Sequence: jetstream.SequencePair{Stream: m.seq}}, nil
}
func (m *msg) Ack() error                       { m.acked = true; return nil }
func (m *msg) NakWithDelay(time.Duration) error { m.naks++; return nil }
func (m *msg) Nak() error                       { m.naks++; return nil }
func (m *msg) TermWithReason(string) error      { m.termed = true; return nil }
func (m *msg) InProgress() error                { m.progress.Add(1); return nil }

// store fails every apply with err, or succeeds when err is nil.
type store struct {
	mu    sync.Mutex
	err   error
	calls int
	// block, if set, is waited on by every apply (before err is read).
	block chan struct{}
}

func (s *store) setErr(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

func (s *store) ApplyBatch(_ context.Context, rs []sale.Reservation) ([]orderstore.Outcome, error) {
	if s.block != nil {
		<-s.block
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
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

func (d *dead) DeadLetterPart(context.Context, jetstream.Msg, int, []byte, string, string, string, string) error {
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

// until waits for cond, failing the test after 10 s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOutageHoldsTheBatch: while the database refuses writes (a read-only
// switchover on either dialect, a full disk) the batch is held: kept alive
// with in-progress acks, never nak'ed, never counted toward MaxDeliver,
// reported by Outage, and applied by itself once writes come back.
func TestOutageHoldsTheBatch(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	wrap := func(err error) error { return fmt.Errorf("orderstore: apply batch of 2: %w", err) }
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"postgres read-only transaction", wrap(&pgconn.PgError{Code: "25006", Message: "cannot execute INSERT in a read-only transaction"})},
		{"postgres disk full", wrap(&pgconn.PgError{Code: "53100", Message: "could not extend file"})},
		{"mariadb read_only", wrap(&mysql.MySQLError{Number: 1290, Message: "The MariaDB server is running with the --read-only option"})},
		{"mysql read-only transaction", wrap(&mysql.MySQLError{Number: 1792, Message: "Cannot execute statement in a READ ONLY transaction."})},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, dl := &store{err: tt.err}, &dead{}
			c := apply.New(st, gate{}, dl, log, nil, apply.Config{MaxDeliver: 1, AckWait: 30 * time.Millisecond, Backoff: []time.Duration{time.Millisecond}})
			var msgs []*msg
			var batch []jetstream.Msg
			for i := 1; i <= 2; i++ {
				r := sale.Reservation{OrderID: fmt.Sprintf("01890000-0000-7000-8000-%012d", i), SKU: "s", User: fmt.Sprintf("u%d", i), Quantity: 1, AcceptedAt: 1}
				data, _ := json.Marshal(r)
				m := &msg{data: data, delivered: 1}
				msgs, batch = append(msgs, m), append(batch, m)
			}
			start := time.Now()
			done := make(chan struct{})
			go func() { defer close(done); c.Handle(context.Background(), batch) }()

			until(t, "Outage to report the held batch", func() bool { _, _, ok := c.Outage(); return ok })
			since, reason, _ := c.Outage()
			if since.Before(start) || reason == "" {
				t.Errorf("Outage() = %v, %q; want a time since the batch came and a reason", since, reason)
			}
			// Held across many tries (well past MaxDeliver) and ack waits.
			until(t, "several tries and in-progress acks", func() bool {
				st.mu.Lock()
				defer st.mu.Unlock()
				return st.calls >= 3 && msgs[0].progress.Load() >= 3 && msgs[1].progress.Load() >= 3
			})
			st.setErr(nil)
			<-done
			for i, m := range msgs {
				if !m.acked || m.naks != 0 || m.termed {
					t.Errorf("message %d: acked %v, naks %d, termed %v; want acked only", i, m.acked, m.naks, m.termed)
				}
			}
			if dl.n != 0 {
				t.Errorf("%d dead letters, want none", dl.n)
			}
			if _, _, ok := c.Outage(); ok {
				t.Error("Outage still reported once the batch was applied")
			}
		})
	}
}

// TestSlowBatchKeptAlive: a batch whose transaction takes several ack
// waits gets in-progress acks meanwhile (the broker would redeliver it to
// another consumer otherwise), and none once it is acked.
func TestSlowBatchKeptAlive(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := &store{block: make(chan struct{})}
	c := apply.New(st, gate{}, &dead{}, log, nil, apply.Config{AckWait: 30 * time.Millisecond})
	r := sale.Reservation{OrderID: "01890000-0000-7000-8000-000000000001", SKU: "s", User: "u", Quantity: 1, AcceptedAt: 1}
	data, _ := json.Marshal(r)
	m := &msg{data: data, delivered: 1}
	done := make(chan struct{})
	go func() { defer close(done); c.Handle(context.Background(), []jetstream.Msg{m}) }()
	until(t, "in-progress acks during the slow apply", func() bool { return m.progress.Load() >= 3 })
	close(st.block)
	<-done
	if !m.acked {
		t.Fatal("not acked")
	}
	n := m.progress.Load()
	time.Sleep(100 * time.Millisecond) // three ack waits: a leaked keep-alive would send more
	if got := m.progress.Load(); got != n {
		t.Errorf("in-progress acks after the ack: %d, want none", got-n)
	}
}

// recordingStore applies every batch, recording the order ids, or fails
// them all with err while it is set.
type recordingStore struct {
	err     error
	applied []string
}

func (s *recordingStore) ApplyBatch(_ context.Context, rs []sale.Reservation) ([]orderstore.Outcome, error) {
	if s.err != nil {
		return nil, s.err
	}
	out := make([]orderstore.Outcome, len(rs))
	for i, r := range rs {
		s.applied = append(s.applied, r.OrderID)
		out[i] = orderstore.Outcome{OrderID: r.OrderID, Status: sale.StatusPendingPayment}
	}
	return out, nil
}
func (s *recordingStore) Ping(context.Context) error { return nil }

// TestDeadPartRememberedByContent: a schema 2 message whose invalid
// reservation was dead-lettered while another waits for a retry does not
// dead-letter it again on its redelivery; and a message of a stream the
// broker re-created, whose sequence numbers start again, at the same
// sequence and index is not taken for it: its reservations are applied.
func TestDeadPartRememberedByContent(t *testing.T) {
	reset := fmt.Errorf("orderstore: apply batch: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)})
	res := func(n int) []byte {
		b, _ := json.Marshal(sale.Reservation{OrderID: fmt.Sprintf("01890000-0000-7000-8000-%012d", n), SKU: "s", User: fmt.Sprintf("u%d", n), Quantity: 1, AcceptedAt: 1})
		return b
	}
	batch := func(parts ...[]byte) []byte {
		return bytes.Join(parts, []byte("\n"))
	}
	st, dl := &recordingStore{err: reset}, &dead{}
	c := apply.New(st, gate{}, dl, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, apply.Config{Backoff: []time.Duration{time.Millisecond}})

	// Stream sequence 7: an invalid reservation and a valid one the
	// database does not take yet.
	first := &msg{data: batch([]byte(`{"sku_id":"s"}`), res(1)), seq: 7, delivered: 1}
	c.Handle(context.Background(), []jetstream.Msg{first})
	if dl.n != 1 || first.naks != 1 || first.acked {
		t.Fatalf("first delivery: %d dead letters, %d naks, acked %v; want 1, 1, false", dl.n, first.naks, first.acked)
	}
	first.delivered = 2
	c.Handle(context.Background(), []jetstream.Msg{first})
	if dl.n != 1 || first.naks != 2 {
		t.Fatalf("redelivery: %d dead letters, %d naks; want the invalid one not dead-lettered again, 2 naks", dl.n, first.naks)
	}

	// The broker lost the stream: a new message 7 with other reservations.
	st.err = nil
	again := &msg{data: batch(res(2), res(3)), seq: 7, delivered: 1}
	c.Handle(context.Background(), []jetstream.Msg{again})
	if !again.acked || len(st.applied) != 2 || dl.n != 1 {
		t.Fatalf("new message 7: acked %v, applied %v, %d dead letters; want acked, both applied", again.acked, st.applied, dl.n)
	}
}
