package main

import (
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// breakerWatch records when the breaker of h's instance is first seen in a
// state, polling it every few milliseconds (so a time it reports is at most
// that late).
type breakerWatch struct {
	mu    sync.Mutex
	first map[string]time.Time
	stop  chan struct{}
	done  chan struct{}
}

func watchBreaker(h *harness) *breakerWatch {
	w := &breakerWatch{first: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			st := h.a.buy.BreakerState()
			w.mu.Lock()
			if _, seen := w.first[st]; !seen {
				w.first[st] = time.Now()
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	h.t.Cleanup(w.close)
	return w
}

// since returns how long after t the state st was first seen, or false.
func (w *breakerWatch) since(st string, t time.Time) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.first[st]
	return at.Sub(t), ok && !at.Before(t)
}

func (w *breakerWatch) reset() {
	w.mu.Lock()
	w.first = map[string]time.Time{}
	w.mu.Unlock()
}

func (w *breakerWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// breakerOutage runs buyers against an instance with the default breaker
// settings, breaks Redis with fault after 5 s of healthy sales (a window
// full of successes), and wants the
// breaker open within 2 s of it and the database fallback selling; heal
// brings Redis back and the breaker must close again (through the half-open
// rebuild) with every invariant holding.
func breakerOutage(t *testing.T, fault func(*testenv.RedisServer), heal func(*testenv.RedisServer)) {
	rs := testenv.StartRedis(t)
	h := newHarness(t, testConfig(t, "external", "FLASHSALE_REDIS_URL", rs.URL))
	h.mustPutSKU("b", 5000, 1)
	w := watchBreaker(h)

	done := make(chan *history)
	go func() { done <- runBuyers(t, h, "b", 3000, 300, 32) }()
	time.Sleep(5 * time.Second)
	w.reset()
	at := time.Now()
	fault(rs)
	time.Sleep(3 * time.Second)
	opened, ok := w.since("open", at)
	if !ok {
		t.Errorf("breaker not open 3s after the fault (state %s)", h.a.buy.BreakerState())
	} else if opened > 2*time.Second {
		t.Errorf("breaker opened %v after the fault, want within 2s", opened)
	} else {
		t.Logf("breaker opened %v after the fault", opened)
	}
	heal(rs)
	hs := <-done
	if hs.direct == 0 {
		t.Error("the database fallback sold nothing while redis was out")
	}
	deadline := time.Now().Add(15 * time.Second)
	for h.a.buy.BreakerState() != "closed" && time.Now().Before(deadline) {
		h.buy("late-buyer", "b", 1, "")
		time.Sleep(100 * time.Millisecond)
	}
	if st := h.a.buy.BreakerState(); st != "closed" {
		t.Fatalf("breaker %s after redis came back", st)
	}
	ids := hs.ids()
	rep := settle(t, h.a, "b", ids, 60*time.Second)
	t.Logf("%d accepted (%d by the fallback); %d orders; codes %v", len(ids), hs.direct, rep.Orders, hs.codes)
}

// TestBreakerOpensOnHungRedis: Redis is frozen (SIGSTOP) under load. Gate
// calls time out; that counts as failures even when the buyers gave up
// first, and the breaker opens within 2 s with the defaults.
func TestBreakerOpensOnHungRedis(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	breakerOutage(t, (*testenv.RedisServer).Pause, (*testenv.RedisServer).Resume)
}

// TestBreakerOpensOnDeadRedis: Redis is killed (-9) under load and started
// again empty; the breaker opens within 2 s with the defaults and the
// rebuild before it closes re-seeds Redis from the database.
func TestBreakerOpensOnDeadRedis(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	breakerOutage(t, (*testenv.RedisServer).Kill, (*testenv.RedisServer).Restart)
}
