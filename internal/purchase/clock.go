package purchase

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// A purchase that reaches the gate has two bounded waits, one after the
// other: the gate call (the breaker's call timeout) and then the stream's
// ack (StreamAck). Both are detached from the buyer's cancellation (see
// guard.reserve; a buyer who leaves during the ack wait leaves an answer
// nobody reads, and the wait ends at its bound as before). A waitClock
// gives both their context with one runtime timer, re-armed for the
// second, where context.WithTimeout would make one per wait; clocks are
// pooled, so a purchase makes no timer at all (Reset re-arms one). The two
// waits' contexts are made in one allocation.
type waitClock struct {
	t     *time.Timer
	cur   atomic.Pointer[phase] // the wait the timer is armed for
	spare *phase                // made with the last wait, not handed out yet
	base  time.Time             // a time.Now reading (now)
}

var waitClocks = sync.Pool{New: func() any {
	c := &waitClock{base: time.Now()}
	c.t = time.AfterFunc(time.Hour, c.fire)
	c.t.Stop()
	return c
}}

// newWaitClock returns a clock from the pool; give it back with put once
// its waits ended.
func newWaitClock() *waitClock { return waitClocks.Get().(*waitClock) }

func (c *waitClock) put() { waitClocks.Put(c) }

// start returns the context of a wait of at most d with parent's values.
// The previous wait, if any, must have ended (stop). Each wait is a new
// context: one handed to a client may outlive the wait.
func (c *waitClock) start(parent context.Context, d time.Duration) *phase {
	p := c.spare
	if p == nil {
		pair := new([2]phase)
		p, c.spare = &pair[0], &pair[1]
	} else {
		c.spare = nil
	}
	p.parent, p.deadline = parent, c.now().Add(d)
	c.cur.Store(p)
	c.t.Reset(d)
	return p
}

// now is the current time by the monotonic clock: base plus the monotonic
// time since base (time.Since reads only that clock; time.Now reads the
// wall clock too, which costs as much again on some virtual machines). A
// deadline made from it compares (Before, Until, Sub with a time.Now) by its
// monotonic reading, exactly; only its wall reading may differ from the
// wall clock's, by the clock's adjustments since base, which is renewed
// every minute.
func (c *waitClock) now() time.Time {
	since := time.Since(c.base)
	if since < 0 || since > time.Minute {
		c.base = time.Now()
		return c.base
	}
	return c.base.Add(since)
}

// fire ends the current wait if its deadline passed (a timer armed for an
// earlier wait, or an earlier purchase, can fire late: it finds a later
// deadline and does nothing).
func (c *waitClock) fire() {
	if p := c.cur.Load(); p != nil && !time.Now().Before(p.deadline) {
		p.end(context.DeadlineExceeded)
	}
}

// stop ends the wait p early and stops the timer.
func (c *waitClock) stop(p *phase) {
	if c.cur.CompareAndSwap(p, nil) {
		c.t.Stop()
	}
	p.end(context.Canceled)
}

// phase is the context of one wait: its parent's values, its own deadline,
// no cancellation but its own.
type phase struct {
	parent   context.Context
	deadline time.Time
	mu       sync.Mutex
	values   context.Context // WithoutCancel(parent), once asked
	done     chan struct{}
	err      error
	afters   []func()
}

var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (p *phase) Deadline() (time.Time, bool) { return p.deadline, true }

// Value is the parent's value of key as context.WithoutCancel(parent) has
// it: not the parent's cancellation (context.Cause of p must not find it).
// That context is made at the first call: a wait whose client reads no
// value makes none.
func (p *phase) Value(key any) any {
	p.mu.Lock()
	if p.values == nil {
		p.values = context.WithoutCancel(p.parent)
	}
	v := p.values
	p.mu.Unlock()
	return v.Value(key)
}

func (p *phase) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		if p.err != nil {
			p.done = closedDone
		} else {
			p.done = make(chan struct{})
		}
	}
	return p.done
}

func (p *phase) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// AfterFunc runs f once p is done, as context.AfterFunc does (a context
// derived from p registers here, not in a goroutine of its own).
func (p *phase) AfterFunc(f func()) (stop func() bool) {
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	p.afters = append(p.afters, f)
	i := len(p.afters) - 1
	p.mu.Unlock()
	return func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.err != nil || p.afters[i] == nil {
			return false
		}
		p.afters[i] = nil
		return true
	}
}

func (p *phase) end(err error) {
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return
	}
	p.err = err
	if p.done == nil {
		p.done = closedDone
	} else {
		close(p.done)
	}
	afters := p.afters
	p.afters = nil
	p.mu.Unlock()
	for _, f := range afters {
		if f != nil {
			go f()
		}
	}
}
