package ticket

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/flashsale/flashsale/internal/altcha"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

// memReplays is the replay set in memory, for the logic tests (the Redis
// one has its own test below).
type memReplays struct {
	mu   sync.Mutex
	seen map[string]string
	err  error
}

func (m *memReplays) Claim(_ context.Context, id string, _ time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return false, m.err
	}
	if m.seen == nil {
		m.seen = map[string]string{}
	}
	if _, ok := m.seen[id]; ok {
		return false, nil
	}
	m.seen[id] = ""
	return true, nil
}

func (m *memReplays) Settle(_ context.Context, id, ticket string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.seen[id]; ok {
		m.seen[id] = ticket
	}
	return nil
}

func (m *memReplays) Settled(_ context.Context, id string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seen[id], m.err
}

var key = []byte("0123456789abcdef0123456789abcdef")

func newService(t *testing.T, cfg Config, r Replays) *Service {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = key
	}
	if cfg.Cost == 0 {
		cfg.Cost = 10 // fast tests: the cost is the client's, not the logic's
	}
	if cfg.BaseWork == 0 {
		cfg.BaseWork = 20
	}
	s, err := New(cfg, r)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var start = time.Date(2026, 12, 12, 20, 0, 0, 0, time.UTC)

func ticketSKU(id string) sale.SKU {
	return sale.SKU{ID: id, StartsAt: start, Crowd: sale.Crowd{TicketRequired: true, TicketsOpenAt: start.Add(-10 * time.Minute)}}
}

func solve(t *testing.T, c Challenge) string {
	t.Helper()
	p, _, err := altcha.Solve(c.Body, c.Work)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRedeemAndCheck walks the happy path: a challenge, its solution, a
// ticket good from the sale's start for TicketTTL, for that buyer and sale.
func TestRedeemAndCheck(t *testing.T) {
	s := newService(t, Config{}, &memReplays{})
	sku := ticketSKU("S1")
	now := start.Add(-5 * time.Minute)
	c, err := s.Challenge(sku, "alice", now)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := s.Redeem(context.Background(), sku, "alice", solve(t, c), now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !tk.ValidFrom.Equal(start) || !tk.Expires.Equal(start.Add(5*time.Minute)) {
		t.Fatalf("ticket valid %v..%v, want %v..%v", tk.ValidFrom, tk.Expires, start, start.Add(5*time.Minute))
	}
	if err := s.Check(tk.Token, sku, "alice", start.Add(time.Minute)); err != nil {
		t.Fatalf("a good ticket: %v", err)
	}
	moved := sku
	moved.StartsAt = start.Add(time.Hour)
	other := ticketSKU("S2")
	forged := tk.Token[:len(tk.Token)-2] + "AA"
	if forged == tk.Token {
		forged = tk.Token[:len(tk.Token)-2] + "BB"
	}
	for name, c := range map[string]struct {
		token string
		sku   sale.SKU
		user  string
		at    time.Time
		why   string
	}{
		"none":         {"", sku, "alice", start, "none given"},
		"other buyer":  {tk.Token, sku, "bob", start, "another buyer"},
		"other SKU":    {tk.Token, other, "alice", start, "another sale"},
		"rescheduled":  {tk.Token, moved, "alice", start.Add(time.Hour), "another sale"},
		"expired":      {tk.Token, sku, "alice", tk.Expires, "expired"},
		"forged":       {forged, sku, "alice", start, "not issued here"},
		"garbage":      {"t1.!!!.x", sku, "alice", start, "not issued here"},
		"no version":   {"hello", sku, "alice", start, "malformed"},
		"a challenge":  {string(c.Body), sku, "alice", start, "malformed"},
		"other issuer": {newService(t, Config{Key: []byte("another key of enough length!!")}, &memReplays{}).sign("S1", "alice", saleID(sku), start.Add(time.Hour)), sku, "alice", start, "not issued here"},
	} {
		err := s.Check(c.token, c.sku, c.user, c.at)
		if !errors.Is(err, ErrInvalidTicket) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: Check = %v, want ErrInvalidTicket saying %q", name, err, c.why)
		}
	}
}

// TestRedeemRefusals: every way a solution can be wrong has its own error,
// and the one used twice is refused the second time.
func TestRedeemRefusals(t *testing.T) {
	var failures []string
	var mu sync.Mutex
	r := &memReplays{}
	s := newService(t, Config{OnFailure: func(_ context.Context, user, kind string) {
		mu.Lock()
		failures = append(failures, user+":"+kind)
		mu.Unlock()
	}}, r)
	ctx := context.Background()
	sku := ticketSKU("S1")
	now := start.Add(-time.Minute)
	fresh := func(user string) (Challenge, string) {
		c, err := s.Challenge(sku, user, now)
		if err != nil {
			t.Fatal(err)
		}
		return c, solve(t, c)
	}
	_, p := fresh("alice")
	if _, err := s.Redeem(ctx, sku, "bob", p, now); !errors.Is(err, ErrOtherBuyer) {
		t.Errorf("other buyer: %v", err)
	}
	if _, err := s.Redeem(ctx, ticketSKU("S2"), "alice", p, now); !errors.Is(err, ErrOtherSale) {
		t.Errorf("other SKU: %v", err)
	}
	moved := sku
	moved.StartsAt = start.Add(time.Hour)
	if _, err := s.Redeem(ctx, moved, "alice", p, now); !errors.Is(err, ErrOtherSale) {
		t.Errorf("rescheduled sale: %v", err)
	}
	if _, err := s.Redeem(ctx, sku, "alice", p, now.Add(6*time.Minute)); !errors.Is(err, ErrExpired) {
		t.Errorf("expired: %v", err)
	}
	// None of the refusals above claimed it: the owner still redeems it,
	// once; sent again (an answer lost), it answers the same ticket.
	first, err := s.Redeem(ctx, sku, "alice", p, now)
	if err != nil || first.Repeat {
		t.Fatalf("the owner's first redeem: %+v, %v", first, err)
	}
	again, err := s.Redeem(ctx, sku, "alice", p, now.Add(time.Second))
	if err != nil || !again.Repeat || again.Token != first.Token || !again.Expires.Equal(first.Expires) {
		t.Errorf("second redeem: %+v, %v; want the first ticket again", again, err)
	}
	// A wrong solution burns its challenge: the right one is then a replay.
	c, good := fresh("carol")
	var m map[string]any
	raw, _ := base64.StdEncoding.DecodeString(good)
	_ = json.Unmarshal(raw, &m)
	m["solution"].(map[string]any)["derivedKey"] = strings.Repeat("ab", 32)
	b, _ := json.Marshal(m)
	if _, err := s.Redeem(ctx, sku, "carol", base64.StdEncoding.EncodeToString(b), now); !errors.Is(err, ErrWrongSolution) {
		t.Errorf("wrong solution: %v", err)
	}
	if _, err := s.Redeem(ctx, sku, "carol", good, now); !errors.Is(err, ErrReplayed) {
		t.Errorf("right solution after a wrong one: %v", err)
	}
	_ = c
	// Forged: signed with another key.
	other := newService(t, Config{Key: []byte("another key of enough length!!")}, &memReplays{})
	oc, err := other.Challenge(sku, "dave", now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Redeem(ctx, sku, "dave", solve(t, oc), now); !errors.Is(err, ErrForged) {
		t.Errorf("forged: %v", err)
	}
	for _, bad := range []string{"", "%%%", base64.StdEncoding.EncodeToString([]byte(`{"challenge":1}`))} {
		if _, err := s.Redeem(ctx, sku, "dave", bad, now); !errors.Is(err, ErrMalformed) {
			t.Errorf("malformed %q: %v", bad, err)
		}
	}
	// The replay set down: no ticket, and not the buyer's fault.
	r.err = errors.New("redis down")
	_, p2 := fresh("erin")
	if _, err := s.Redeem(ctx, sku, "erin", p2, now); err == nil || errors.Is(err, ErrReplayed) || !strings.Contains(err.Error(), "redis down") {
		t.Errorf("replay set down: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"carol:proof", "carol:replay", "dave:proof"}
	if strings.Join(failures, ",") != strings.Join(want, ",") {
		t.Errorf("failures reported %v, want %v", failures, want)
	}
}

// TestChallengeOpensAndLevels: no challenge before tickets open or for a
// sale without tickets; the work doubles with each level of load or of
// the buyer's failures, up to the cap.
func TestChallengeOpensAndLevels(t *testing.T) {
	s := newService(t, Config{BaseWork: 100, RateStep: 10, MaxLevel: 4, PerBuyer: 1000}, &memReplays{})
	sku := ticketSKU("S1")
	if _, err := s.Challenge(sku, "a", sku.Crowd.TicketsOpenAt.Add(-time.Second)); !errors.Is(err, ErrNotOpen) {
		t.Errorf("before tickets open: %v", err)
	}
	plain := sku
	plain.Crowd = sale.Crowd{}
	if _, err := s.Challenge(plain, "a", start); !errors.Is(err, ErrNotRequired) {
		t.Errorf("a sale without tickets: %v", err)
	}
	for _, c := range []struct {
		rate     float64
		failures int
		want     int
	}{{0, 0, 0}, {9, 0, 0}, {10, 0, 1}, {30, 0, 2}, {70, 0, 3}, {0, 2, 2}, {10, 2, 3}, {1e6, 0, 4}, {0, 99, 4}} {
		if got := s.Level(c.rate, c.failures); got != c.want {
			t.Errorf("Level(%v, %d) = %d, want %d", c.rate, c.failures, got, c.want)
		}
	}
	// Challenges in one second raise the level as the curve says.
	at := start.Add(time.Minute)
	var levels []int
	for range 40 {
		c, err := s.Challenge(sku, "a", at)
		if err != nil {
			t.Fatal(err)
		}
		if c.Work != 100<<c.Level {
			t.Fatalf("work %d at level %d", c.Work, c.Level)
		}
		levels = append(levels, c.Level)
	}
	if levels[0] != 0 || levels[9] != 1 || levels[29] != 2 || levels[39] != 2 {
		t.Errorf("levels over 40 challenges in one second: %v", levels)
	}
	// A buyer's failure raises that buyer's level only.
	s.failed(context.Background(), "a", "proof", at)
	c, _ := s.Challenge(sku, "a", at.Add(5*time.Second))
	d, _ := s.Challenge(sku, "b", at.Add(5*time.Second))
	if c.Level != d.Level+1 {
		t.Errorf("after one failure: level %d, another buyer's %d", c.Level, d.Level)
	}
}

// TestRedisReplaysConcurrent: against a real Redis, of 50 concurrent
// redeems of one solution exactly one makes a ticket; the others are
// refused as replays or, once it is made, answered that same ticket.
func TestRedisReplaysConcurrent(t *testing.T) {
	url, prefix := testenv.Redis(t)
	rc := testenv.RedisClient(t, url)
	s := newService(t, Config{PerBuyer: 100}, RedisReplays{Client: rc, Prefix: prefix})
	now := time.Now() // the replay key's TTL is Redis' own: real time
	sku := ticketSKU("S1")
	sku.StartsAt = now.Add(time.Minute)
	sku.Crowd.TicketsOpenAt = now.Add(-time.Minute)
	c, err := s.Challenge(sku, "alice", now)
	if err != nil {
		t.Fatal(err)
	}
	p := solve(t, c)
	var made, repeats, replayed atomic.Int32
	var mu sync.Mutex
	tokens := map[string]bool{}
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, err := s.Redeem(context.Background(), sku, "alice", p, now)
			switch {
			case err == nil && tk.Repeat:
				repeats.Add(1)
			case err == nil:
				made.Add(1)
			case errors.Is(err, ErrReplayed):
				replayed.Add(1)
			default:
				t.Error(err)
			}
			if err == nil {
				mu.Lock()
				tokens[tk.Token] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if made.Load() != 1 || repeats.Load()+replayed.Load() != 49 || len(tokens) != 1 {
		t.Fatalf("%d tickets made, %d repeats, %d replays, %d distinct tokens; want 1 made, 49 others, 1 token",
			made.Load(), repeats.Load(), replayed.Load(), len(tokens))
	}
	if again, err := s.Redeem(context.Background(), sku, "alice", p, now); err != nil || !again.Repeat || !tokens[again.Token] {
		t.Fatalf("a redeem after the race: %+v, %v; want the ticket made", again, err)
	}
	ttl, err := rc.Do(context.Background(), rc.B().Pttl().Key(prefix+":altcha:"+challengeID(t, p)).Build()).AsInt64()
	if err != nil || ttl <= 0 {
		t.Fatalf("the replay key's TTL: %d, %v (it must expire with the challenge)", ttl, err)
	}
}

func challengeID(t *testing.T, payload string) string {
	var m struct {
		Challenge struct {
			Signature string `json:"signature"`
		} `json:"challenge"`
	}
	raw, _ := base64.StdEncoding.DecodeString(payload)
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m.Challenge.Signature
}

// TestPerBuyerLimit: a buyer gets PerBuyer challenges a minute, then 429
// until the minute is over; another buyer is not affected.
func TestPerBuyerLimit(t *testing.T) {
	s := newService(t, Config{PerBuyer: 3}, &memReplays{})
	sku := ticketSKU("S1")
	for i := range 3 {
		if _, err := s.Challenge(sku, "a", start.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.Challenge(sku, "a", start.Add(10*time.Second))
	var rl *sale.RateLimitError
	if !errors.As(err, &rl) || rl.Scope != "user" || rl.RetryAfter != 50*time.Second {
		t.Fatalf("fourth challenge in a minute: %v", err)
	}
	if _, err := s.Challenge(sku, "b", start.Add(10*time.Second)); err != nil {
		t.Fatalf("another buyer: %v", err)
	}
	if _, err := s.Challenge(sku, "a", start.Add(time.Minute)); err != nil {
		t.Fatalf("the next minute: %v", err)
	}
}

// TestInstanceBudgetsTakenLast: the instance's challenge and verify
// budgets are spent only by requests that reach a derivation; refusals
// that cost less (a sale without tickets, before they open, a buyer past
// its own limit, a forged or another buyer's solution) leave them alone,
// so a flood of them cannot starve other buyers.
func TestInstanceBudgetsTakenLast(t *testing.T) {
	chl, ver := rate.NewLimiter(0, 1), rate.NewLimiter(0, 1) // one token each, never refilled
	s := newService(t, Config{PerBuyer: 2, ChallengeLimit: chl, VerifyLimit: ver}, &memReplays{})
	other := newService(t, Config{Key: []byte("another key of enough length!!")}, &memReplays{})
	ctx := context.Background()
	sku := ticketSKU("S1")
	now := start.Add(-time.Minute)
	plain := sku
	plain.Crowd = sale.Crowd{}
	early := sku.Crowd.TicketsOpenAt.Add(-time.Second)
	for range 5 {
		if _, err := s.Challenge(plain, "bot", now); !errors.Is(err, ErrNotRequired) {
			t.Fatal(err)
		}
		if _, err := s.Challenge(sku, "bot", early); !errors.Is(err, ErrNotOpen) {
			t.Fatal(err)
		}
	}
	s.allow(&s.issued, "greedy", now)
	s.allow(&s.issued, "greedy", now)
	if _, err := s.Challenge(sku, "greedy", now); err == nil || !strings.Contains(err.Error(), "user limit") {
		t.Fatalf("past its own limit: %v", err)
	}
	c, err := s.Challenge(sku, "alice", now) // takes the one challenge token
	if err != nil {
		t.Fatalf("alice's challenge after the refusals: %v", err)
	}
	if _, err := s.Challenge(sku, "bob", now); !strings.Contains(fmt.Sprint(err), "instance limit") {
		t.Fatalf("the budget spent: %v", err)
	}
	oc, err := other.Challenge(sku, "bot", now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Redeem(ctx, sku, "bot", solve(t, oc), now); !errors.Is(err, ErrForged) {
		t.Fatalf("forged: %v", err)
	}
	p := solve(t, c)
	if _, err := s.Redeem(ctx, sku, "bot2", p, now); !errors.Is(err, ErrOtherBuyer) {
		t.Fatalf("another buyer's: %v", err)
	}
	if _, err := s.Redeem(ctx, sku, "alice", p, now); err != nil {
		t.Fatalf("alice's redeem after the refusals: %v", err)
	}
}
