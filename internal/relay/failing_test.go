package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/relay"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// healthPub acknowledges every message and reports itself failing or not.
type healthPub struct {
	failing atomic.Bool
	got     chan string
}

func (p *healthPub) Publish(_ context.Context, msgs []orderqueue.Message) []error {
	for _, m := range msgs {
		p.got <- m.ID
	}
	return make([]error, len(msgs))
}

func (p *healthPub) PublishHealth() orderqueue.PublishHealth {
	return orderqueue.PublishHealth{Failing: p.failing.Load()}
}

type emptyBox struct{}

func (emptyBox) SKUs(context.Context) ([]string, error) { return nil, nil }
func (emptyBox) Outbox(context.Context, string, time.Time, int) ([]stockgate.Pending, error) {
	return nil, nil
}
func (emptyBox) Unqueue(context.Context, string, ...string) error { return nil }

// TestPublishWhileStreamFailing: while the stream acknowledges no publish,
// a purchase does not wait for the ack (every purchase used to wait the
// whole stream-ack timeout): Publish answers ErrStreamFailing at once and
// the reservation still goes to the fast path, whose next ack ends the
// failing state.
func TestPublishWhileStreamFailing(t *testing.T) {
	pub := &healthPub{got: make(chan string, 10)}
	r := relay.New(emptyBox{}, pub, slog.New(slog.DiscardHandler), relay.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)

	pub.failing.Store(true)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	start := time.Now()
	if err := r.Publish(wctx, "k", "o1", []byte("{}")); !errors.Is(err, relay.ErrStreamFailing) {
		t.Fatalf("Publish while failing: %v, want ErrStreamFailing", err)
	}
	if wctx.Err() != nil {
		t.Fatalf("Publish while failing waited %v", time.Since(start))
	}
	if id := <-pub.got; id != "o1" {
		t.Fatalf("fast path published %q, want o1", id)
	}
	pub.failing.Store(false)
	if err := r.Publish(wctx, "k", "o2", []byte("{}")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}
