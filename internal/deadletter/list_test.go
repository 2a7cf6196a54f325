package deadletter_test

import (
	"context"
	"testing"

	"github.com/flashsale/flashsale/internal/deadletter"
	"github.com/flashsale/flashsale/internal/orderqueue"
)

// racingQueue is a dead-letter stream to which the consumer adds one dead
// letter straight after the first read of List, whichever read that is: the
// interleaving of a dead letter written while an operator lists them.
type racingQueue struct {
	deadletter.Queue // unused methods
	letters          []orderqueue.DeadLetter
	late             orderqueue.DeadLetter
	reads            int
}

func (q *racingQueue) read() {
	q.reads++
	if q.reads == 1 {
		q.letters = append(q.letters, q.late)
	}
}

func (q *racingQueue) DeadLetters(_ context.Context, after uint64, limit int) ([]orderqueue.DeadLetter, error) {
	var out []orderqueue.DeadLetter
	for _, d := range q.letters {
		if d.Seq > after && len(out) < limit {
			out = append(out, d)
		}
	}
	q.read()
	return out, nil
}

func (q *racingQueue) DeadLetterCount(context.Context) (uint64, error) {
	n := uint64(len(q.letters))
	q.read()
	return n, nil
}

// TestListCountsOnlyWhatItShows: a dead letter written while List runs is
// either listed or not yet counted; the count never names a dead letter the
// page (not full) leaves out, so a caller waiting for "count" dead letters
// finds every one of them in the page.
func TestListCountsOnlyWhatItShows(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int
	}{
		{"room for all", 100},
		{"room for exactly the two", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &racingQueue{
				letters: []orderqueue.DeadLetter{{Seq: 1, OrderID: "first"}},
				late:    orderqueue.DeadLetter{Seq: 2, OrderID: "second"},
			}
			ds, n, err := deadletter.New(q, nil, nil).List(context.Background(), 0, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if n > uint64(len(ds)) {
				t.Fatalf("count %d but the page lists %d: %+v", n, len(ds), ds)
			}
		})
	}
}
