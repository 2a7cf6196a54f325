package risk

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

// recordingStore is a Store that keeps the entries added, with their
// actors, and fails while fail is set.
type recordingStore struct {
	mu     sync.Mutex
	added  []Entry
	actors []string
	fail   atomic.Bool
}

func (s *recordingStore) AddRisk(ctx context.Context, c orderstore.RiskChange, now time.Time) (Entry, error) {
	if s.fail.Load() {
		return Entry{}, errors.New("database down")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, _ := ctx.Value(orderstore.ActorKey{}).(orderstore.Actor)
	e := Entry{ID: int64(len(s.added) + 1), Kind: c.Kind, Value: c.Value, Reason: c.Reason, Source: c.Source, Actor: a.Name, CreatedAt: now, ExpiresAt: c.ExpiresAt}
	s.added, s.actors = append(s.added, e), append(s.actors, a.Name)
	return e, nil
}

func (s *recordingStore) RemoveRisk(context.Context, int64, time.Time) (Entry, error) {
	return Entry{}, sale.ErrUnknownRiskEntry
}

func (s *recordingStore) RiskEntries(context.Context, string, time.Time) ([]Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Entry(nil), s.added...), nil
}

func (s *recordingStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.added)
}

func newStrikes(t *testing.T, cfg Config) (*Strikes, *recordingStore, *atomic.Int64, string) {
	t.Helper()
	url, prefix := testenv.Redis(t)
	store := &recordingStore{}
	var changes atomic.Int64
	s, err := NewStrikes(testenv.RedisClient(t, url), prefix, store, cfg, func() { changes.Add(1) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.now = func() time.Time { return t0 }
	return s, store, &changes, prefix
}

// TestStrikesReplay: the third spent solution sent again lists the buyer once, for the
// auto TTL, as "flashsale"; later strikes report blocked without listing
// again; another buyer and another kind count apart.
func TestStrikesReplay(t *testing.T) {
	s, store, changes, prefix := newStrikes(t, DefaultConfig())
	ctx := t.Context()
	for i, want := range []bool{false, false, true, true} {
		got, err := s.Strike(ctx, "mallory", StrikeReplay)
		if err != nil || got != want {
			t.Fatalf("replay strike %d = %v, %v; want %v", i+1, got, err, want)
		}
	}
	if got, err := s.Strike(ctx, "mallory", StrikeProof); err != nil || got {
		t.Errorf("first proof strike = %v, %v", got, err)
	}
	if got, err := s.Strike(ctx, "alice", StrikeReplay); err != nil || got {
		t.Errorf("alice's first replay strike = %v, %v", got, err)
	}
	if store.count() != 1 || changes.Load() != 1 {
		t.Fatalf("%d entries, %d notices; want 1 of each", store.count(), changes.Load())
	}
	e := store.added[0]
	want := Entry{ID: 1, Kind: "buyer", Value: "mallory", Reason: "auto: 3 spent solutions sent again in 10m0s", Source: "auto", Actor: "flashsale",
		CreatedAt: t0, ExpiresAt: t0.Add(15 * time.Minute)}
	if e != want {
		t.Errorf("entry %+v, want %+v", e, want)
	}

	// The counter expires with its window; the claim with the TTL.
	rdb := s.rdb
	for key, max := range map[string]time.Duration{
		prefix + ":risk:strikes:{risk:mallory}:replay": 10 * time.Minute,
		prefix + ":risk:auto:{risk:mallory}":           15 * time.Minute,
	} {
		ms, err := rdb.Do(ctx, rdb.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil || ms <= 0 || time.Duration(ms)*time.Millisecond > max {
			t.Errorf("PTTL %s = %d, %v; want 1..%s", key, ms, err, max)
		}
	}
}

// TestStrikesConcurrent: buyers failing on many instances at once reach
// the threshold once: one entry.
func TestStrikesConcurrent(t *testing.T) {
	s, store, _, _ := newStrikes(t, Config{ProofStrikes: 20, ReplayStrikes: 3})
	var wg sync.WaitGroup
	var blocked atomic.Int64
	for range 60 {
		wg.Go(func() {
			b, err := s.Strike(t.Context(), "bot-7", StrikeProof)
			if err != nil {
				t.Error(err)
			}
			if b {
				blocked.Add(1)
			}
		})
	}
	wg.Wait()
	if store.count() != 1 || blocked.Load() != 41 {
		t.Errorf("%d entries, %d strikes blocked; want 1 and 41", store.count(), blocked.Load())
	}
	if r := store.added[0].Reason; r != "auto: 20 failed proofs in 10m0s" {
		t.Errorf("reason %q", r)
	}
}

// TestStrikesStoreDown: when the listing cannot be written, the claim is
// given back and the next failure lists the buyer.
func TestStrikesStoreDown(t *testing.T) {
	s, store, changes, _ := newStrikes(t, Config{ReplayStrikes: 2})
	ctx := t.Context()
	store.fail.Store(true)
	if _, err := s.Strike(ctx, "eve", StrikeReplay); err != nil {
		t.Fatal(err)
	}
	if b, err := s.Strike(ctx, "eve", StrikeReplay); !b || err == nil || !strings.Contains(err.Error(), "database down") {
		t.Fatalf("strike at the threshold with the store down = %v, %v", b, err)
	}
	store.fail.Store(false)
	if b, err := s.Strike(ctx, "eve", StrikeReplay); !b || err != nil || store.count() != 1 || changes.Load() != 1 {
		t.Fatalf("next strike = %v, %v, %d entries, %d notices", b, err, store.count(), changes.Load())
	}
}

// TestStrikesOffAndInvalid: a kind with threshold 0 counts nothing (no
// key); an unknown kind or a bad user id is refused.
func TestStrikesOffAndInvalid(t *testing.T) {
	s, _, _, prefix := newStrikes(t, Config{ProofStrikes: 0, ReplayStrikes: 3})
	ctx := t.Context()
	if b, err := s.Strike(ctx, "alice", StrikeProof); b || err != nil {
		t.Errorf("proof strike, off = %v, %v", b, err)
	}
	n, err := s.rdb.Do(ctx, s.rdb.B().Exists().Key(prefix+":risk:strikes:{risk:alice}:proof").Build()).AsInt64()
	if err != nil || n != 0 {
		t.Errorf("EXISTS of a counter switched off = %d, %v", n, err)
	}
	for _, c := range []struct{ user, kind string }{{"alice", "other"}, {"bad id", StrikeReplay}, {"", StrikeReplay}} {
		if _, err := s.Strike(ctx, c.user, c.kind); !errors.Is(err, sale.ErrInvalid) {
			t.Errorf("Strike(%q, %q) = %v, want ErrInvalid", c.user, c.kind, err)
		}
	}
	if _, err := NewStrikes(nil, "p", nil, Config{ProofStrikes: -1}, nil, nil); err == nil {
		t.Error("negative strikes accepted")
	}
	if _, err := NewStrikes(nil, "p", nil, Config{Window: time.Millisecond}, nil, nil); err == nil {
		t.Error("a 1ms window accepted")
	}
}
