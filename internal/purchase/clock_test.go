package purchase

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// TestWaitClock: each wait is done at its own deadline with
// DeadlineExceeded (or Canceled when stopped first), carries its parent's
// values but not its cancellation (nor its cause), and a timer armed for
// an earlier wait (of this purchase or of one before it in the pool) ends
// no later one.
func TestWaitClock(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	cancel()      // the buyer left: the waits are detached from it
	for range 3 { // the clock comes back from the pool
		c := newWaitClock()
		gate := c.start(parent, 30*time.Millisecond)
		if gate.Value(ctxKey{}) != "v" || gate.Err() != nil {
			t.Fatalf("value %v err %v", gate.Value(ctxKey{}), gate.Err())
		}
		if d, ok := gate.Deadline(); !ok || time.Until(d) > 30*time.Millisecond {
			t.Fatalf("deadline %v %v", d, ok)
		}
		child, stopChild := context.WithTimeout(gate, time.Hour) // registers with AfterFunc
		select {
		case <-gate.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("gate wait not done at its deadline")
		}
		if !errors.Is(gate.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(gate), context.DeadlineExceeded) {
			t.Fatalf("gate err %v, cause %v", gate.Err(), context.Cause(gate))
		}
		select {
		case <-child.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("derived context not done with its parent")
		}
		stopChild()
		c.stop(gate)

		ack := c.start(parent, time.Hour)
		time.Sleep(40 * time.Millisecond)
		c.fire() // a late fire of the first wait's timer
		if ack.Err() != nil {
			t.Fatalf("second wait ended early: %v", ack.Err())
		}
		c.stop(ack)
		if !errors.Is(ack.Err(), context.Canceled) {
			t.Fatalf("stopped wait: %v", ack.Err())
		}
		<-ack.Done()
		c.put()
	}
}
