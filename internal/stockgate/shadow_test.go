package stockgate_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// startShadow runs a shadow of sku with the candidate script (empty: this
// build's) until the test ends, and waits until the live path journals.
func startShadow(t *testing.T, g *stockgate.Gate, sku, script string, cfg stockgate.ShadowConfig) *stockgate.Shadow {
	t.Helper()
	cfg.Instance, cfg.Script = "t-"+sku, script
	cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	s, _ := runShadow(t, g, sku, cfg)
	return s
}

// runShadow runs a shadow of sku with cfg and waits until the live path
// journals; stop (also called when the test ends) stops it and waits for
// its Run to return.
func runShadow(t *testing.T, g *stockgate.Gate, sku string, cfg stockgate.ShadowConfig) (s *stockgate.Shadow, stop func()) {
	t.Helper()
	s = g.NewShadow(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx, sku) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	for deadline := time.Now().Add(10 * time.Second); !g.JournalLeased(ctx, sku); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the shadow did not take the journal lease")
		}
	}
	return s, stop
}

// altered is this build's reserve script with from replaced by to: a
// deliberately different candidate.
func altered(t *testing.T, from, to string) string {
	t.Helper()
	src := strings.Replace(stockgate.ReserveScript(), from, to, 1)
	if src == stockgate.ReserveScript() {
		t.Fatalf("%q is not in the reserve script", from)
	}
	return src
}

// equivalent is a candidate that decides as this build's gate but is
// another script (as the next release's would be): its decisions are compared.
var equivalent = stockgate.ReserveScript() + "\n-- the next release's gate, deciding as this one\n"

// waitCompared waits until the shadow has counted n decisions.
func waitCompared(t *testing.T, s *stockgate.Shadow, n int64) stockgate.ShadowStats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := s.Stats()
		if st.Match+st.Mismatch+st.Dropped+st.Same >= n || time.Now().After(deadline) {
			return st
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestShadowMatchesLive: 64 buyers at once on one sale (accepted, limit
// reached, sold out, duplicates of an Idempotency-Key and of an order id),
// with releases giving units back meanwhile: the shadow running this
// build's decisions (another script) agrees with every live decision, none
// dropped.
func TestShadowMatchesLive(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "sh", 150, 3)
	s := startShadow(t, g, "sh", equivalent, stockgate.ShadowConfig{})

	var decided atomic.Int64
	var mu sync.Mutex
	var accepted []sale.Reservation
	var wg sync.WaitGroup
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				r := res("sh", fmt.Sprintf("u%d", (w*20+i)%90), int64(1+i%2))
				if i%5 == 0 {
					r.IdempotencyKey = fmt.Sprintf("k%d", w)
				}
				out, err := g.Reserve(ctx, r)
				switch {
				case err == nil:
					decided.Add(1)
					if !out.Duplicate {
						mu.Lock()
						accepted = append(accepted, r)
						mu.Unlock()
						if i%7 == 0 { // the caller's retry of the same order id
							if _, err := g.Reserve(ctx, r); err != nil {
								t.Error(err)
							}
							decided.Add(1)
						}
					}
				case errors.Is(err, sale.ErrSoldOut), errors.Is(err, sale.ErrLimitReached):
					decided.Add(1)
				default:
					t.Error(err)
				}
			}
		}(w)
	}
	// Releases give units back while buyers buy: state the journal's
	// entries carry, not attempts a shadow could replay.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 10; i++ {
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			if len(accepted) == 0 {
				mu.Unlock()
				continue
			}
			r := accepted[0]
			accepted = accepted[1:]
			mu.Unlock()
			if _, err := g.Finalize(ctx, "sh", []stockgate.Outcome{{OrderID: r.OrderID, Refused: true}}); err != nil {
				t.Error(err)
			}
		}
	}()
	wg.Wait()
	st := waitCompared(t, s, decided.Load())
	if st.Match != decided.Load() || st.Mismatch != 0 || st.Dropped != 0 {
		t.Fatalf("shadow of the same script: %+v, want %d matches and nothing else", st, decided.Load())
	}
}

// TestShadowCountsMismatches: a candidate that lets a buyer go one unit
// over the per-user limit differs from the live path exactly where the live
// path refused limit_reached for one unit too many; every other decision
// matches.
func TestShadowCountsMismatches(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "sm", 1000, 1)
	wrong := altered(t, "if held + qty > limit then", "if held + qty > limit + 1 then")
	s := startShadow(t, g, "sm", wrong, stockgate.ShadowConfig{})
	const users = 50
	for round := 0; round < 2; round++ {
		for u := 0; u < users; u++ {
			_, err := g.Reserve(ctx, res("sm", fmt.Sprintf("u%d", u), 1))
			if want := round == 1; errors.Is(err, sale.ErrLimitReached) != want {
				t.Fatalf("round %d user %d: %v", round, u, err)
			}
		}
	}
	st := waitCompared(t, s, 2*users)
	if st.Match != users || st.Mismatch != users || st.Dropped != 0 {
		t.Fatalf("shadow of a candidate without the limit: %+v, want %d matches and %d mismatches", st, users, users)
	}
	if len(st.Examples) != 10 || st.Examples[0].Live != "limit_reached, 1 held" || !strings.HasPrefix(st.Examples[0].Shadow, "accepted, ") {
		t.Fatalf("examples: %+v", st.Examples)
	}
}

// TestShadowCountsDropped: a shadow allowed fewer comparisons a second than
// the sale makes decisions counts the rest as dropped, and the live
// purchases are unaffected; once the shadow stops, the live path stops
// journaling.
func TestShadowCountsDropped(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "sd", 500, 1)
	s, stop := runShadow(t, g, "sd", stockgate.ShadowConfig{Instance: "t-sd", Rate: 10, Script: equivalent})
	for u := 0; u < 300; u++ {
		if _, err := g.Reserve(ctx, res("sd", fmt.Sprintf("u%d", u), 1)); err != nil {
			t.Fatal(err)
		}
	}
	st := waitCompared(t, s, 300)
	if st.Match+st.Dropped != 300 || st.Mismatch != 0 || st.Dropped < 250 {
		t.Fatalf("rate-limited shadow: %+v, want about 10 compared and the rest of 300 dropped", st)
	}
	stop()
	if g.JournalLeased(ctx, "sd") {
		t.Fatal("the lease outlived the shadow")
	}
}

// testWriter writes a logger's lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestLayoutVersion: a seed records the key layout it wrote (1); the
// reserve script serves a bucket without the field (seeded by an older
// release) and refuses one in a newer layout with ErrLayoutNewer (503
// unavailable for the buyer), writing nothing.
func TestLayoutVersion(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	seed(t, g, "lv", 10, 2)
	meta := g.KeysOf("lv").Meta
	if v, err := c.Do(ctx, c.B().Hget().Key(meta).Field("layout").Build()).ToString(); err != nil || v != "1" {
		t.Fatalf("layout after a seed: %q %v, want 1", v, err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Do(ctx, c.B().Hdel().Key(meta).Field("layout").Build()).Error())
	if _, err := g.Reserve(ctx, res("lv", "u1", 1)); err != nil {
		t.Fatalf("a bucket an older release seeded: %v", err)
	}
	must(c.Do(ctx, c.B().Hset().Key(meta).FieldValue().FieldValue("layout", "2").Build()).Error())
	_, err := g.Reserve(ctx, res("lv", "u2", 1))
	if !errors.Is(err, stockgate.ErrLayoutNewer) || !errors.Is(err, sale.ErrUnavailable) {
		t.Fatalf("a bucket in a newer layout: %v, want ErrLayoutNewer (unavailable)", err)
	}
	if got := avail(t, g, "lv"); got != 9 {
		t.Fatalf("available %d after the refusal, want 9 (nothing written)", got)
	}
}

// TestShadowSameScript: decisions made by a script identical to the
// candidate (the canary's own, or a stable group of the same build) are
// counted apart and not compared.
func TestShadowSameScript(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "ss", 100, 1)
	s := startShadow(t, g, "ss", "", stockgate.ShadowConfig{})
	for u := 0; u < 20; u++ {
		if _, err := g.Reserve(ctx, res("ss", fmt.Sprintf("u%d", u), 1)); err != nil {
			t.Fatal(err)
		}
	}
	if st := waitCompared(t, s, 20); st.Same != 20 || st.Match+st.Mismatch+st.Dropped != 0 {
		t.Fatalf("a candidate identical to the live script: %+v, want 20 same_script", st)
	}
}

// TestShadowCandidateError: a candidate that raises an error on some
// attempts differs on exactly those (a script error is a decision that
// differs, not a dropped comparison); the others are compared as usual.
func TestShadowCandidateError(t *testing.T) {
	g, _ := newGate(t)
	ctx := context.Background()
	seed(t, g, "se", 1000, 5)
	broken := altered(t, "local qty = tonumber(ARGV[3])", "local qty = tonumber(ARGV[3])\nif qty == 2 then error('candidate bug') end")
	s := startShadow(t, g, "se", broken, stockgate.ShadowConfig{})
	for u := 0; u < 20; u++ {
		if _, err := g.Reserve(ctx, res("se", fmt.Sprintf("u%d", u), int64(1+u%5/4))); err != nil { // qty 2 for u%5 == 4
			t.Fatal(err)
		}
	}
	st := waitCompared(t, s, 20)
	if st.Mismatch != 4 || st.Match != 16 || st.Dropped != 0 || !strings.HasPrefix(st.Examples[0].Shadow, "script error: ") {
		t.Fatalf("a candidate failing on quantity 2: %+v, want 4 mismatches (script errors) and 16 matches", st)
	}
}

// TestTwoShadows: two shadows of one sale (two canaries, or one restarted)
// each hold a lease: one stopping leaves the other's journal running and
// counting; the last one stopping ends journaling and deletes the journal.
func TestTwoShadows(t *testing.T) {
	g, c := newGate(t)
	ctx := context.Background()
	seed(t, g, "s2", 1000, 5)
	a, stopA := runShadow(t, g, "s2", stockgate.ShadowConfig{Instance: "t-a", Script: equivalent})
	_, stopB := runShadow(t, g, "s2", stockgate.ShadowConfig{Instance: "t-b", Script: equivalent})
	// b holds its lease beside a's before it stops.
	holders := g.Prefix() + ":{s2}:shadows"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, _ := c.Do(ctx, c.B().Hlen().Key(holders).Build()).AsInt64(); n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second shadow took no lease")
		}
	}
	stopB()
	if !g.JournalLeased(ctx, "s2") {
		t.Fatal("the other shadow's stop ended the journal")
	}
	for u := 0; u < 20; u++ {
		if _, err := g.Reserve(ctx, res("s2", fmt.Sprintf("u%d", u), 1)); err != nil {
			t.Fatal(err)
		}
	}
	if st := waitCompared(t, a, 20); st.Match != 20 {
		t.Fatalf("the shadow left running: %+v, want 20 matches", st)
	}
	// The last one stops: nothing journals and the journal is gone.
	stopA()
	if g.JournalLeased(ctx, "s2") {
		t.Error("the lease outlived the last shadow")
	}
	if n, _ := c.Do(ctx, c.B().Exists().Key(g.KeysOf("s2").Journal).Build()).AsInt64(); n != 0 {
		t.Error("the journal outlived the last shadow")
	}
}
