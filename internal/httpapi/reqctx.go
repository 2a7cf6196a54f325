package httpapi

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
)

// reqCtx is the context of a routed request: its parent's (the
// connection's) values and cancellation, the request's state (stateKey),
// the audit trail's actor once a user is authenticated
// (orderstore.ActorKey), and the deadline of Config.Timeout. The
// deadline's timer is made only when something waits on the context (Done,
// which a derived context also calls): a purchase, whose waits have their
// own bounds (the purchase package's clock), and a refusal from memory make
// none, while a database call waiting on the context gets the bound as with
// context.WithTimeout.
// Deadline and Err say what context.WithTimeout's would at any moment.
type reqCtx struct {
	parent   context.Context
	st       *reqState
	deadline time.Time
	mu       sync.Mutex
	real     atomic.Pointer[realCtx] // once something waited
	ended    atomic.Bool             // answered before anything waited
}

type realCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func (c *reqCtx) init(parent context.Context, st *reqState, deadline time.Time) {
	c.parent, c.st, c.deadline = parent, st, deadline
}

func (c *reqCtx) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

func (c *reqCtx) Value(key any) any {
	switch key.(type) {
	case stateKey:
		return c.st
	case orderstore.ActorKey:
		// The authenticated user acts (Server.user), composed when a
		// store call asks: a purchase makes none.
		if c.st.user != "" {
			return orderstore.Actor{Name: "user:" + c.st.user, SourceIP: c.st.clientIP}
		}
	}
	if r := c.real.Load(); r != nil {
		// The timer's context: a context derived from this one finds
		// its canceller (it registers there, as with WithTimeout).
		return r.ctx.Value(key)
	}
	return c.parent.Value(key)
}

func (c *reqCtx) Done() <-chan struct{} { return c.materialize().Done() }

func (c *reqCtx) Err() error {
	if r := c.real.Load(); r != nil {
		return r.ctx.Err()
	}
	if c.ended.Load() {
		return context.Canceled
	}
	if err := c.parent.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// materialize makes the deadline's timer: context.WithDeadline of the parent.
func (c *reqCtx) materialize() context.Context {
	if r := c.real.Load(); r != nil {
		return r.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.real.Load(); r != nil {
		return r.ctx
	}
	ctx, cancel := context.WithDeadline(c.parent, c.deadline)
	if c.ended.Load() {
		cancel() // answered: done, as WithTimeout's after its cancel
	}
	c.real.Store(&realCtx{ctx: ctx, cancel: cancel})
	return ctx
}

// end is the cancel of the request's context: the request is answered.
func (c *reqCtx) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended.Store(true)
	if r := c.real.Load(); r != nil {
		r.cancel()
	}
}
