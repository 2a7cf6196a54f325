package orderqueue_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/sale"
)

// deadLetter moves m to the dead letters as the apply consumer does: copy,
// then terminate.
func deadLetter(t *testing.T, q *orderqueue.Queue, m jetstream.Msg, orderID, sku, reason string) {
	t.Helper()
	if err := q.DeadLetter(context.Background(), m, orderID, sku, reason); err != nil {
		t.Fatal(err)
	}
	if err := m.Term(); err != nil {
		t.Fatal(err)
	}
}

func deadCount(t *testing.T, q *orderqueue.Queue) uint64 {
	t.Helper()
	n, err := q.DeadLetterCount(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDeadLetter: a dead letter keeps the payload, the order id, the SKU
// (as its subject), the reason (at most 1000 bytes), the delivery count and
// the stream sequence of the message it copies; copying the same delivery
// twice (a crash between copy and terminate) stores it once; a SKU that is
// not valid is filed under "_malformed".
func TestDeadLetter(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	ctx := context.Background()
	r1, r2 := resv("k", 1), resv("k", 2)
	publishAll(t, q, message(r1))
	m := fetch(t, q, 1)[0]
	if err := m.Nak(); err != nil { // a failed delivery: the next one is the second
		t.Fatal(err)
	}
	m = fetch(t, q, 1)[0]
	publishAll(t, q, message(r2))
	before := time.Now()
	long := strings.Repeat("x", 1500)
	if err := q.DeadLetter(ctx, m, r1.OrderID, r1.SKU, long); err != nil {
		t.Fatal(err)
	}
	if err := q.DeadLetter(ctx, m, r1.OrderID, r1.SKU, long); err != nil { // again, after a crash
		t.Fatal(err)
	}
	after := time.Now()
	if err := m.Term(); err != nil {
		t.Fatal(err)
	}
	bad := fetch(t, q, 1)[0]
	deadLetter(t, q, bad, "not-an-order", "no such sku!", "malformed")

	if n := deadCount(t, q); n != 2 {
		t.Fatalf("DeadLetterCount = %d, want 2 (the repeated copy stored once)", n)
	}
	got, err := q.DeadLetters(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []orderqueue.DeadLetter{
		{Seq: 1, OrderID: r1.OrderID, SKU: "k", Reason: long[:1000], Deliveries: 2, StreamSeq: 1, Data: message(r1).Data, Schema: "1"},
		{Seq: 2, OrderID: "not-an-order", SKU: "_malformed", Reason: "malformed", Deliveries: 1, StreamSeq: 2, Data: message(r2).Data, Schema: "1"},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(orderqueue.DeadLetter{}, "FailedAt")); diff != "" {
		t.Errorf("DeadLetters (-want +got):\n%s", diff)
	}
	for _, d := range got {
		if d.FailedAt.Before(before.Add(-time.Second)) || d.FailedAt.After(time.Now()) {
			t.Errorf("dead letter %d failed at %v, want between %v and %v", d.Seq, d.FailedAt, before, after)
		}
	}
	one, err := q.GetDeadLetter(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got[0], one); diff != "" {
		t.Errorf("GetDeadLetter(1) differs from its listing (-list +get):\n%s", diff)
	}
	r, err := one.Reservation()
	if err != nil || r != r1 {
		t.Errorf("Reservation() = %+v, %v; want %+v", r, err, r1)
	}
	// The messages left the apply consumer (terminated), nothing pending.
	statsUntil(t, q, "after dead-lettering both: want nothing pending", func(st orderqueue.Stats) bool { return st.Pending == 0 && st.AckPending == 0 })
}

// TestDeadLetterReservation: a payload that is not a valid reservation
// decodes to an error (wrapping sale.ErrInvalid when it is not JSON).
func TestDeadLetterReservation(t *testing.T) {
	t.Parallel()
	zero := resv("k", 1)
	zero.Quantity = 0
	if _, err := (orderqueue.DeadLetter{Seq: 7, Data: []byte(`not json`)}).Reservation(); !errors.Is(err, sale.ErrInvalid) {
		t.Errorf("Reservation of a payload that is not JSON: %v, want sale.ErrInvalid", err)
	}
	for _, data := range []string{string(message(zero).Data), `{}`} {
		if _, err := (orderqueue.DeadLetter{Seq: 7, Data: []byte(data)}).Reservation(); err == nil {
			t.Errorf("Reservation of %s: nil error, want it refused", data)
		}
	}
}

func seqs(ds []orderqueue.DeadLetter) []uint64 {
	out := []uint64{}
	for _, d := range ds {
		out = append(out, d.Seq)
	}
	return out
}

// TestDeadLettersPaging: DeadLetters lists up to limit, oldest first, from
// sequence after+1, skipping deleted ones; GetDeadLetter of a deleted one
// answers ErrNoDeadLetter, and deleting it again is nil (a discard or
// replay repeated after an interruption, or two at once).
func TestDeadLettersPaging(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	ctx := context.Background()
	var rs []sale.Reservation
	for i := 1; i <= 5; i++ {
		rs = append(rs, resv("k", i))
		publishAll(t, q, message(rs[i-1]))
	}
	for i, m := range fetch(t, q, 5) {
		deadLetter(t, q, m, rs[i].OrderID, "k", "poison")
	}

	list := func(after uint64, limit int) []uint64 {
		t.Helper()
		ds, err := q.DeadLetters(ctx, after, limit)
		if err != nil {
			t.Fatal(err)
		}
		return seqs(ds)
	}
	pages := []struct {
		after uint64
		limit int
		want  []uint64
	}{
		{0, 2, []uint64{1, 2}},
		{2, 2, []uint64{3, 4}},
		{4, 10, []uint64{5}},
		{5, 10, []uint64{}},
		{0, 0, []uint64{}},
		{3, 1, []uint64{4}},
		{math.MaxUint64, 10, []uint64{}}, // after+1 must not wrap to the start
	}
	for _, p := range pages {
		if diff := cmp.Diff(p.want, list(p.after, p.limit)); diff != "" {
			t.Errorf("DeadLetters(%d, %d) (-want +got):\n%s", p.after, p.limit, diff)
		}
	}

	for _, seq := range []uint64{2, 4} {
		if err := q.DeleteDeadLetter(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	if n := deadCount(t, q); n != 3 {
		t.Fatalf("DeadLetterCount after deleting 2 of 5 = %d", n)
	}
	pages = []struct {
		after uint64
		limit int
		want  []uint64
	}{
		{0, 10, []uint64{1, 3, 5}},
		{0, 2, []uint64{1, 3}}, // the limit counts dead letters, not sequence numbers
		{1, 2, []uint64{3, 5}},
		{3, 2, []uint64{5}},
	}
	for _, p := range pages {
		if diff := cmp.Diff(p.want, list(p.after, p.limit)); diff != "" {
			t.Errorf("after deleting 2 and 4: DeadLetters(%d, %d) (-want +got):\n%s", p.after, p.limit, diff)
		}
	}
	for _, seq := range []uint64{2, 99} {
		if _, err := q.GetDeadLetter(ctx, seq); !errors.Is(err, orderqueue.ErrNoDeadLetter) {
			t.Errorf("GetDeadLetter(%d) = %v, want ErrNoDeadLetter", seq, err)
		}
	}
	if d, err := q.GetDeadLetter(ctx, 3); err != nil || d.OrderID != rs[2].OrderID {
		t.Errorf("GetDeadLetter(3) = %+v, %v; want %s", d, err, rs[2].OrderID)
	}
	for _, seq := range []uint64{2, 99} { // deleted already, never there: nothing to do
		if err := q.DeleteDeadLetter(ctx, seq); err != nil {
			t.Errorf("DeleteDeadLetter(%d) of a dead letter that is not there: %v, want nil", seq, err)
		}
	}
	if err := q.DeleteDeadLetter(ctx, 1); err != nil { // the first: the stream's first sequence moves
		t.Fatal(err)
	}
	if diff := cmp.Diff([]uint64{3, 5}, list(0, 10)); diff != "" {
		t.Errorf("after deleting the first (-want +got):\n%s", diff)
	}
}

// TestReplay: a replayed dead letter lands on the order stream again under
// a new message id, although its order id is still inside the duplicate
// window, and the apply consumer is delivered its payload on its SKU's
// subject.
func TestReplay(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{DuplicateWindow: time.Hour})
	ctx := context.Background()
	r := resv("k", 1)
	publishAll(t, q, message(r))
	deadLetter(t, q, fetch(t, q, 1)[0], r.OrderID, r.SKU, "poison")
	d, err := q.GetDeadLetter(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	publishAll(t, q, message(r)) // still a duplicate: dropped
	statsUntil(t, q, "before the replay: want 1 stored, none pending", func(st orderqueue.Stats) bool { return st.Messages == 1 && st.Pending == 0 })
	if err := q.Replay(ctx, d); err != nil {
		t.Fatal(err)
	}
	statsUntil(t, q, "after the replay: want it stored and pending", func(st orderqueue.Stats) bool { return st.Messages == 2 && st.Pending == 1 })
	got := deliveredOf(fetch(t, q, 1))[0]
	if got.Subject != orderqueue.SubjectPrefix+"k" || got.Data != string(message(r).Data) || got.MsgID == "" || got.MsgID == r.OrderID {
		t.Errorf("replayed message %+v; want the payload on %sk under a new message id", got, orderqueue.SubjectPrefix)
	}
	// Replay does not remove the dead letter: the caller does.
	if n := deadCount(t, q); n != 1 {
		t.Errorf("DeadLetterCount after Replay = %d, want 1", n)
	}
}

func byOrderID(rs []sale.Reservation) []sale.Reservation {
	out := slices.Clone(rs)
	sort.Slice(out, func(i, j int) bool { return out[i].OrderID < out[j].OrderID })
	return out
}

// TestUnapplied: the reservations the stream holds past the apply
// consumer's ack floor (delivered or not) plus every dead letter, per SKU
// (a bucket's reservations under their SKU); acknowledged ones and payloads
// that are not reservations are left out; the readers leave no consumer
// behind.
func TestUnapplied(t *testing.T) {
	t.Parallel()
	q := openQueue(t, orderqueue.Config{})
	ctx := context.Background()

	if got, err := q.Unapplied(ctx, "k"); err != nil || len(got) != 0 {
		t.Fatalf("Unapplied on an empty queue = %v, %v", got, err)
	}
	if got, err := q.UnappliedAll(ctx); err != nil || len(got) != 0 {
		t.Fatalf("UnappliedAll on an empty queue = %v, %v", got, err)
	}

	k1, k2, k3, j1, j2, k4 := resv("k", 1), resv("k", 2), resv("k", 3), resv("j", 4), resv("j", 5), resv("k", 6)
	k4.Bucket = "k~7"
	bad := orderqueue.Message{ID: "bad", SKU: "k", Data: []byte(`{"order_id":"bad"}`)}
	publishAll(t, q, message(k1), message(k2), message(k3), message(j1), message(j2), bad, message(k4))
	ms := fetch(t, q, 6) // k4 stays undelivered
	deadLetter(t, q, ms[2], k3.OrderID, k3.SKU, "poison")
	for _, m := range []jetstream.Msg{ms[0], ms[1], ms[3]} { // j2 and bad: delivered, not acknowledged
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ci, err := q.Consumer().Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.AckFloor.Stream == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ack floor %d, want 4 (1, 2 acknowledged, 3 terminated, 4 acknowledged)", ci.AckFloor.Stream)
		}
		time.Sleep(10 * time.Millisecond)
	}

	want := map[string][]sale.Reservation{"k": {k3, k4}, "j": {j2}}
	for _, sku := range []string{"k", "j", "z"} {
		got, err := q.Unapplied(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(byOrderID(want[sku]), byOrderID(got), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("Unapplied(%s) (-want +got):\n%s", sku, diff)
		}
	}
	all, err := q.UnappliedAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for sku := range all {
		all[sku] = byOrderID(all[sku])
	}
	for sku := range want {
		want[sku] = byOrderID(want[sku])
	}
	if diff := cmp.Diff(want, all); diff != "" {
		t.Errorf("UnappliedAll (-want +got):\n%s", diff)
	}

	for _, name := range []string{orderqueue.StreamName, orderqueue.DeadLetterStream} {
		st, err := q.JetStream().Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for n := range st.ConsumerNames(ctx).Name() {
			names = append(names, n)
		}
		want := []string(nil)
		if name == orderqueue.StreamName {
			want = []string{orderqueue.ConsumerName}
		}
		if diff := cmp.Diff(want, names); diff != "" {
			t.Errorf("consumers of %s after the reads (-want +got):\n%s", name, diff)
		}
	}
}
