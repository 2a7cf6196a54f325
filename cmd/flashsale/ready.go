package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/internal/apply"
	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// readyChecks are /readyz's checks. Readiness means "this instance can take
// purchases" (check purchases): a balancer takes out only an instance that
// cannot, since most faults (the database, the broker) are shared by every
// instance and would empty the pool at once while the outbox or the
// database fallback still sells. Every other check only reports, with its
// reason, as degraded; a check that must take the instance out answers
// httpapi.Unready. Add a dependency's state here: one named check each.
func (a *app) readyChecks(consumer *apply.Consumer) []httpapi.Checker {
	return []httpapi.Checker{
		{Name: "purchases", Critical: true, Check: a.purchasesCheck},
		// Named after the dialect: "postgres" or "mysql".
		{Name: string(a.store.Dialect()), Check: a.databaseCheck},
		{Name: "redis", Check: a.redisCheck},
		// An evicting Redis corrupts the gate silently: out, whatever else works.
		{Name: "redis-maxmemory-policy", Check: a.evictionCheck},
		{Name: "jetstream", Check: degradedBy("broker unreachable: purchases wait in the Redis outbox", a.queue.Ping)},
		// The broker answers but lost the streams (restarted on an empty
		// store, or a stream between leaders): purchases wait in the
		// outbox until they are re-created (every second, RunEnsure).
		{Name: "jetstream-streams", Check: degradedBy("streams being re-created: purchases wait in the Redis outbox", a.queue.Ready)},
		// The broker answers and has the streams but acknowledges no
		// publish (a full disk): purchases wait in the outbox.
		{Name: "jetstream-publish", Check: a.publishCheck},
		// The database refuses writes (read-only during a switchover, a
		// full disk) while it answers pings: the consumer holds its
		// batches until it takes them. Purchases go on through Redis,
		// their orders wait in the stream.
		{Name: "database-writes", Check: degradedBy("the database refuses writes: orders wait in the stream until it takes them", databaseWrites(consumer))},
	}
}

func degradedBy(reason string, check func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := check(ctx); err != nil {
			return httpapi.Degraded(reason, err)
		}
		return nil
	}
}

// gatePingBound bounds the purchases check's PING of Redis while the
// database fallback is on: a hung Redis must leave the check time to answer
// "the fallback sells" within /readyz's own bound (700 ms), not time out
// with it and read as unready.
const gatePingBound = 400 * time.Millisecond

// purchasesCheck: ready while the Redis gate sells (Redis answers, breaker
// closed) or the database fallback can (it is on and the database answers).
// Both are tried at once, so one that hangs leaves the other its time. The
// gate's ping is given gatePingBound by the clock, not only by its context:
// a call that picks a connection being set up again waits for that set-up
// under the deadline of whichever caller began it (see
// stockgate.DialWithin), which may be longer than this check's.
func (a *app) purchasesCheck(ctx context.Context) error {
	gatec, dbc := make(chan error, 1), make(chan error, 1)
	go func() {
		if st := a.buy.BreakerState(); st != "closed" {
			gatec <- fmt.Errorf("redis breaker %s", st)
			return
		}
		if a.cfg.FallbackConc > 0 {
			gatec <- within(ctx, gatePingBound, a.gate.Ping)
			return
		}
		gatec <- a.gate.Ping(ctx)
	}()
	go func() {
		if a.cfg.FallbackConc == 0 {
			dbc <- errors.New("database fallback off (FLASHSALE_FALLBACK_CONCURRENCY=0)")
			return
		}
		dbc <- a.store.Ping(ctx)
	}()
	gerr := <-gatec
	if gerr == nil {
		return nil
	}
	derr := <-dbc
	if derr == nil {
		return httpapi.Degraded("redis gate unusable: the database fallback sells", gerr)
	}
	return httpapi.Unready("neither the redis gate nor the database fallback can sell",
		fmt.Errorf("gate: %w; fallback: %w", gerr, derr))
}

// errNoAnswer is within's error for a call that outlived its bound.
var errNoAnswer = errors.New("no answer in time")

// within runs f under a deadline of d and returns by then whether or not f
// does (f keeps running until it returns; its result is dropped): for
// calls whose library does not always honour a context's deadline.
func within(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	errc := make(chan error, 1)
	go func() {
		defer cancel()
		errc <- f(ctx)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		// The call's goroutine ends ctx right after it answered, so both
		// cases can be ready: its answer, sent first, wins.
		select {
		case err := <-errc:
			return err
		default:
		}
		return fmt.Errorf("%w (%s): %w", errNoAnswer, d, ctx.Err())
	}
}

// databaseCheck: the database out (or out of connection slots) degrades:
// purchases go on through Redis and the orders are applied once it answers.
func (a *app) databaseCheck(ctx context.Context) error {
	err := a.store.Ping(ctx)
	switch {
	case err == nil:
		return nil
	case orderstore.IsTooManyConnections(err):
		return httpapi.Degraded("connection slots exhausted: purchases go on through redis, orders are applied once it has room", err)
	default:
		return httpapi.Degraded("database unreachable: purchases go on through redis, orders are applied once it answers", err)
	}
}

func (a *app) redisCheck(ctx context.Context) error {
	if err := a.gate.Ping(ctx); err != nil {
		if a.cfg.FallbackConc == 0 {
			return httpapi.Degraded("redis unreachable and the database fallback off", err)
		}
		return httpapi.Degraded("redis unreachable: the database fallback sells", err)
	}
	return nil
}

// evictionCheck takes the instance out while a primary may evict keys (an
// operator changed the policy since the start, or a failover promoted a
// replica configured otherwise). A Redis that cannot be read is the redis
// check's business.
func (a *app) evictionCheck(ctx context.Context) error {
	err := a.gate.CheckEviction(ctx)
	if errors.Is(err, stockgate.ErrEvicting) {
		return httpapi.Unready("a redis primary's maxmemory-policy is not noeviction: set noeviction", err)
	}
	return nil
}

// publishCheck: the stream acknowledges no publish (the embedded server's
// store cannot write, or several rounds in a row failed): degraded, the
// accepted purchases wait in the Redis outbox.
func (a *app) publishCheck(context.Context) error {
	if err := a.publishHealth(); err != nil {
		if errors.Is(err, orderqueue.ErrStoreFull) {
			return httpapi.Degraded("the embedded stream's disk is full: purchases wait in the Redis outbox", err)
		}
		return httpapi.Degraded("the stream acknowledges no publish: purchases wait in the Redis outbox", err)
	}
	return nil
}

// publishHealth is nil while the order stream takes publishes.
func (a *app) publishHealth() error {
	if a.embedded != nil {
		if err := a.embedded.Health(); err != nil {
			return err
		}
	}
	return a.queue.PublishCheck(context.Background())
}
