package purchase

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/stockgate"
)

// fakeLeaser grants what it is told to; the scripts' own rules are tested
// against Redis in internal/stockgate (soldlease_test.go), and the whole
// path in cmd/flashsale (TestKeyedRetryNeverSoldOutLeased).
type fakeLeaser struct {
	mu            sync.Mutex
	grant         bool
	keys          []string
	until         time.Duration // the lease's until, from the call
	takes, renews int
}

func (f *fakeLeaser) TakeSoldLease(_ context.Context, _ string, _ time.Duration, _ int) (stockgate.SoldLease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.takes++
	if !f.grant {
		return stockgate.SoldLease{Reason: "units"}, nil
	}
	return stockgate.SoldLease{Granted: true, Version: "1", Epoch: "e", Keys: f.keys, Until: time.Now().Add(f.until)}, nil
}

func (f *fakeLeaser) RenewSoldLease(_ context.Context, _ string, _ time.Duration, l stockgate.SoldLease) (stockgate.SoldLease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.renews++
	if !f.grant || l.Version != "1" || l.Epoch != "e" {
		return stockgate.SoldLease{Reason: "changed"}, nil
	}
	return stockgate.SoldLease{Granted: true, Version: "1", Epoch: "e", Until: time.Now().Add(f.until)}, nil
}

func (f *fakeLeaser) set(grant bool, until time.Duration) {
	f.mu.Lock()
	f.grant, f.until = grant, until
	f.mu.Unlock()
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5 s: %s", what)
		}
	}
}

// TestSoldLeaseSnapshot: a key is answered "made no order" only from a
// live snapshot that does not hold it; a key the snapshot holds, a lease
// refused or renewed no more, a dropped snapshot and leases turned off all
// ask Redis.
func TestSoldLeaseSnapshot(t *testing.T) {
	f := &fakeLeaser{grant: true, keys: []string{"ann\x00k1", "bob\x00k2"}, until: time.Hour}
	s := &Service{}
	ls := &s.leases
	ls.ttl, ls.max, ls.g, ls.log = 90*time.Millisecond, 10, f, slog.New(slog.DiscardHandler)
	now := time.Now()
	if ls.absent("s", "cat", "k3", now) {
		t.Fatal("answered from a snapshot while leases are off")
	}
	s.SetSoldLeases(true)
	if ls.absent("s", "cat", "k3", now) {
		t.Fatal("answered before any snapshot was taken")
	}
	eventually(t, "a snapshot is taken", func() bool { ls.absent("s", "x", "y", time.Now()); return s.SoldLeased("s") })
	counted := s.SoldOutFromLease()
	if ls.absent("s", "ann", "k1", time.Now()) || ls.absent("s", "bob", "k2", time.Now()) {
		t.Fatal("a key the snapshot holds was answered from it")
	}
	if !ls.absent("s", "cat", "k3", time.Now()) || !ls.absent("s", "ann", "k2", time.Now()) {
		t.Fatal("a key the snapshot does not hold was not answered from it")
	}
	if got := s.SoldOutFromLease() - counted; got != 2 {
		t.Fatalf("%d answers from the snapshot counted, want 2", got)
	}
	// Renewed while asked.
	eventually(t, "renewals", func() bool {
		ls.absent("s", "x", "y", time.Now()) // asked: the keeper goes on
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.renews >= 2
	})

	// A snapshot whose lease ended is not used.
	f.set(true, -time.Millisecond)
	eventually(t, "the ended lease's snapshot is not used", func() bool { return !ls.absent("s", "cat", "k3", time.Now()) })

	// A renewal refused: no snapshot until a new one is taken.
	f.set(true, time.Hour)
	eventually(t, "a new snapshot", func() bool { ls.absent("s", "x", "y", time.Now()); return s.SoldLeased("s") })
	f.set(false, time.Hour)
	eventually(t, "the refused renewal drops the snapshot", func() bool { ls.absent("s", "x", "y", time.Now()); return !s.SoldLeased("s") })
	if ls.absent("s", "cat", "k3", time.Now()) {
		t.Fatal("answered after the renewal was refused")
	}

	// A notice that units came back drops it at once.
	f.set(true, time.Hour)
	eventually(t, "a new snapshot", func() bool { ls.absent("s", "x", "y", time.Now()); return s.SoldLeased("s") })
	s.leases.drop("s")
	if ls.absent("s", "cat", "k3", time.Now()) {
		t.Fatal("answered from a dropped snapshot")
	}

	// Turned off: not used, and the keeper stops.
	eventually(t, "a new snapshot", func() bool { ls.absent("s", "x", "y", time.Now()); return s.SoldLeased("s") })
	s.SetSoldLeases(false)
	if ls.absent("s", "cat", "k3", time.Now()) {
		t.Fatal("answered from a snapshot after leases were turned off")
	}
	eventually(t, "the keeper stops", func() bool { _, ok := ls.m.Load("s"); return !ok })

	// Unasked for two lease lengths, the keeper stops too.
	s.SetSoldLeases(true)
	ls.absent("s", "x", "y", time.Now())
	eventually(t, "a new snapshot", func() bool { return s.SoldLeased("s") })
	eventually(t, "the unasked keeper stops", func() bool { _, ok := ls.m.Load("s"); return !ok })
}
