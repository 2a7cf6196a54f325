package risk

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/testenv"
)

// fakeSource is a Source in memory that counts full loads.
type fakeSource struct {
	mu      sync.Mutex
	version int64
	entries []Entry
	loads   int
	err     error
}

func (f *fakeSource) RiskVersion(context.Context) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.version, f.err
}

func (f *fakeSource) RiskEntries(_ context.Context, _ string, now time.Time) ([]Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	f.loads++
	var out []Entry
	for _, e := range f.entries {
		if e.Live(now) {
			out = append(out, e)
		}
	}
	return out, nil
}

func (f *fakeSource) set(version int64, es ...Entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.version, f.entries = version, es
}

// TestSyncerRunOnce: a pass reloads only when the counter moved, or a
// loaded entry expired; a failing source leaves the lists as they were.
func TestSyncerRunOnce(t *testing.T) {
	ctx := t.Context()
	src := &fakeSource{}
	s := NewSyncer(&List{}, src, nil, 0)
	src.set(1, entry(1, "buyer", "mallory", time.Time{}), entry(2, "buyer", "brief", t0.Add(time.Minute)))
	step := func(at time.Time, wantReload bool, wantLoads int) {
		t.Helper()
		got, err := s.RunOnce(ctx, at)
		if err != nil || got != wantReload || src.loads != wantLoads {
			t.Fatalf("RunOnce at %s = %v, %v with %d loads; want %v with %d", at.Sub(t0), got, err, src.loads, wantReload, wantLoads)
		}
	}
	step(t0, true, 1) // first load
	step(t0.Add(time.Second), false, 1)
	if _, ok := s.List().Blocked("brief", netip.Addr{}, t0); !ok {
		t.Fatal("brief not blocked")
	}
	step(t0.Add(time.Minute), true, 2) // brief's entry expired: tidied away
	if s.List().Len() != 1 {
		t.Errorf("Len %d after the expiry reload", s.List().Len())
	}
	step(t0.Add(2*time.Minute), false, 2)
	src.set(2, entry(1, "buyer", "mallory", time.Time{}), entry(3, "ip", "192.0.2.0/24", time.Time{}))
	step(t0.Add(3*time.Minute), true, 3)
	if _, ok := s.List().Blocked("", netip.MustParseAddr("192.0.2.4"), t0); !ok {
		t.Fatal("the new range does not block")
	}
	src.mu.Lock()
	src.err, src.version = errors.New("database down"), 3
	src.mu.Unlock()
	if _, err := s.RunOnce(ctx, t0.Add(4*time.Minute)); err == nil {
		t.Fatal("a failing source: no error")
	}
	if _, ok := s.List().Blocked("mallory", netip.Addr{}, t0); !ok {
		t.Fatal("a failing source emptied the lists")
	}
	if err := s.Refresh(ctx, t0); err == nil {
		t.Fatal("Refresh of a failing source: no error")
	}
}

// openStore opens a migrated store on url: one instance's connection to
// the shared database.
func openStore(t *testing.T, url string) *orderstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := orderstore.Open(ctx, url, orderstore.Options{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitFor waits up to within for cond, checking every 10 ms.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
	}
}

// TestTwoInstances: two instances, each with its own connection and
// Syncer, over one database. A change made through one reaches the other's
// lists by the change notice at once and, with no notice at all, by the
// one-second check of the counter.
func TestTwoInstances(t *testing.T) {
	url := testenv.Database(t)
	a, b := openStore(t, url), openStore(t, url)
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	admin := orderstore.WithActor(ctx, orderstore.Actor{Name: "admin"})

	start := func(st *orderstore.Store, period time.Duration, notices bool) *Syncer {
		s := NewSyncer(&List{}, st, nil, period)
		if notices {
			sub, err := Subscribe(nc, s)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
		}
		var wg sync.WaitGroup
		wg.Go(func() { s.Run(ctx) })
		t.Cleanup(wg.Wait)
		t.Cleanup(cancel) // runs before wg.Wait
		return s
	}
	blocked := func(s *Syncer, user string) func() bool {
		return func() bool { _, ok := s.List().Blocked(user, netip.Addr{}, time.Now()); return ok }
	}

	t.Run("notice", func(t *testing.T) {
		// A period far beyond the test: only the notice can bring the change.
		sa, sb := start(a, time.Hour, true), start(b, time.Hour, true)
		adm := Admin{Store: a, Changed: NewAnnouncer(nc, nil).Changed}
		e, err := adm.Add(admin, orderstore.RiskChange{Kind: "buyer", Value: "mallory", Reason: "test"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "instance a lists mallory", blocked(sa, "mallory"))
		waitFor(t, 5*time.Second, "instance b lists mallory", blocked(sb, "mallory"))
		if _, err := adm.Remove(admin, e.ID, time.Now()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "instance b unlists mallory", func() bool { return !blocked(sb, "mallory")() })
	})

	t.Run("poll", func(t *testing.T) {
		// No notice: the one-second check of the counter.
		sb := start(b, DefaultPeriod, false)
		adm := Admin{Store: a}
		if _, err := adm.Add(admin, orderstore.RiskChange{Kind: "buyer", Value: "trudy", Reason: "test"}, time.Now()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "instance b lists trudy without a notice", blocked(sb, "trudy"))
	})
}
