package room

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/testenv"
)

// clock is a settable clock for Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }
func (c *clock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// stock is a settable Remaining callback.
type stock struct {
	mu    sync.Mutex
	units int64
	known bool
	err   error
}

func (s *stock) set(units int64, known bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.units, s.known = units, known
}

func (s *stock) remaining(context.Context, string) (int64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.units, s.known, s.err
}

// counter is an Observer that counts.
type counter struct {
	mu                             sync.Mutex
	joined, polled, soldOut, admit int64
	etaErrors                      []float64
}

func (c *counter) Joined(string)  { c.mu.Lock(); c.joined++; c.mu.Unlock() }
func (c *counter) Polled(string)  { c.mu.Lock(); c.polled++; c.mu.Unlock() }
func (c *counter) SoldOut(string) { c.mu.Lock(); c.soldOut++; c.mu.Unlock() }
func (c *counter) Admitted(_ string, n int64) {
	c.mu.Lock()
	c.admit += n
	c.mu.Unlock()
}
func (c *counter) EtaError(_ string, s float64) {
	c.mu.Lock()
	c.etaErrors = append(c.etaErrors, s)
	c.mu.Unlock()
}

var t0 = time.Date(2026, 12, 24, 10, 0, 0, 0, time.UTC)

type env struct {
	client rueidis.Client
	prefix string
	clock  *clock
	stock  *stock
	obs    *counter
	cfg    Config
}

// newEnv: a private prefix on the shared Redis, the clock at t0, plenty of
// stock, a default rate of 10/s.
func newEnv(t *testing.T) *env {
	t.Helper()
	url, prefix := testenv.Redis(t)
	e := &env{client: testenv.RedisClient(t, url), prefix: prefix, clock: &clock{t: t0}, stock: &stock{units: 1_000_000, known: true}, obs: &counter{}}
	e.cfg = Config{Prefix: prefix, Key: []byte("test key, 16 bytes or more"), DefaultRate: 10, Tick: 100 * time.Millisecond, Now: e.clock.Now, Timeout: 5 * time.Second}
	return e
}

// room returns one "instance" on the env's Redis and prefix.
func (e *env) room(t *testing.T, owner string) *Room {
	t.Helper()
	cfg := e.cfg
	cfg.Owner = owner
	r, err := New(e.client, cfg, e.obs, e.stock.remaining)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func join(t *testing.T, r *Room, s Settings, user string) Status {
	t.Helper()
	st, err := r.Join(context.Background(), s, user)
	if err != nil {
		t.Fatalf("Join(%s): %v", user, err)
	}
	return st
}

func poll(t *testing.T, r *Room, s Settings, user string) Status {
	t.Helper()
	st, err := r.Poll(context.Background(), s, user)
	if err != nil {
		t.Fatalf("Poll(%s): %v", user, err)
	}
	return st
}

func tick(t *testing.T, r *Room, s Settings, now time.Time) Tick {
	t.Helper()
	tk, err := r.Tick(context.Background(), s, now)
	if err != nil {
		t.Fatalf("Tick: %v", err)
	}
	return tk
}

func users(n int) []string {
	u := make([]string, n)
	for i := range u {
		u[i] = fmt.Sprintf("user%03d", i)
	}
	return u
}

// TestLotteryAtOpening: buyers who join before the opening wait without a
// position; at the opening they get a permutation of 1..P, the same on
// every poll and on both instances; later buyers come after them.
func TestLotteryAtOpening(t *testing.T) {
	e := newEnv(t)
	a, b := e.room(t, "a"), e.room(t, "b")
	s := Settings{SKU: "sku1", OpensAt: t0.Add(time.Minute)}
	const p = 50
	us := users(p)
	for i, u := range us {
		r := a
		if i%2 == 1 {
			r = b
		}
		st := join(t, r, s, u)
		if st.State != StateWaiting || st.Position != 0 || st.Ahead != -1 || st.ETASeconds != -1 {
			t.Fatalf("before the opening %s got %+v, want waiting without a position", u, st)
		}
		if st.PollAfter < 8*time.Second || st.PollAfter > 12*time.Second {
			t.Errorf("PollAfter %v a minute before the opening, want about %v", st.PollAfter, maxPoll)
		}
	}

	e.clock.Set(s.OpensAt) // the first poll at the opening draws
	pos := map[string]int64{}
	for i, u := range us {
		r := []*Room{a, b}[i%2]
		pos[u] = poll(t, r, s, u).Position
	}
	got := make([]int64, 0, p)
	for _, v := range pos {
		got = append(got, v)
	}
	slices.Sort(got)
	want := make([]int64, p)
	for i := range want {
		want[i] = int64(i + 1)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("lottery positions are not a permutation of 1..%d (-want +got):\n%s", p, diff)
	}
	identity := 0
	for i, u := range us {
		if pos[u] == int64(i+1) {
			identity++
		}
	}
	if identity > p/2 {
		t.Errorf("%d of %d buyers kept their join order: no lottery", identity, p)
	}

	e.clock.Add(time.Second)
	for i, u := range us { // every instance, every poll: the same answer
		for _, r := range []*Room{b, a} {
			if got := poll(t, r, s, u).Position; got != pos[u] {
				t.Fatalf("%s (joined %d) at %d, then %d", u, i+1, pos[u], got)
			}
		}
	}
	if got := join(t, a, s, "late").Position; got != p+1 {
		t.Errorf("first buyer after the opening at %d, want %d", got, p+1)
	}
	st, err := a.Stats(context.Background(), s.SKU)
	if err != nil || !st.Drawn || st.Lottery != p || st.Joined != p+1 {
		t.Errorf("Stats = %+v, %v; want drawn, lottery %d, joined %d", st, err, p, p+1)
	}
}

// TestJoinAtOpeningDraws: the first call after the opening is a join; it
// draws the lottery before numbering itself, so it comes after every
// buyer who joined before.
func TestJoinAtOpeningDraws(t *testing.T) {
	e := newEnv(t)
	r := e.room(t, "a")
	s := Settings{SKU: "sku1", OpensAt: t0.Add(time.Second)}
	for _, u := range users(3) {
		join(t, r, s, u)
	}
	e.clock.Set(s.OpensAt)
	if got := join(t, r, s, "first-after").Position; got != 4 {
		t.Fatalf("join at the opening got position %d, want 4", got)
	}
	var got []int64
	for _, u := range users(3) {
		got = append(got, poll(t, r, s, u).Position)
	}
	slices.Sort(got)
	if diff := cmp.Diff([]int64{1, 2, 3}, got); diff != "" {
		t.Errorf("pre-open positions (-want +got):\n%s", diff)
	}
}

// TestFirstComeFirstServed: after the opening, positions follow join order.
func TestFirstComeFirstServed(t *testing.T) {
	e := newEnv(t)
	a, b := e.room(t, "a"), e.room(t, "b")
	s := Settings{SKU: "sku1", OpensAt: t0.Add(-time.Minute)}
	last := int64(0)
	for i, u := range users(30) {
		st := join(t, []*Room{a, b}[i%2], s, u)
		if st.Position <= last {
			t.Fatalf("%s joined after position %d and got %d", u, last, st.Position)
		}
		last = st.Position
	}
	if last != 30 {
		t.Errorf("last position %d, want 30", last)
	}
}

// TestJoinIdempotent: 200 goroutines, 100 buyers each joining twice on two
// instances: one place per buyer, places 1..100.
func TestJoinIdempotent(t *testing.T) {
	e := newEnv(t)
	rooms := []*Room{e.room(t, "a"), e.room(t, "b")}
	s := Settings{SKU: "sku1"}
	us := users(100)
	var mu sync.Mutex
	got := map[string][]int64{}
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			u := us[i%100]
			st, err := rooms[i/100].Join(context.Background(), s, u)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			got[u] = append(got[u], st.Position)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var all []int64
	for u, p := range got {
		if len(p) != 2 || p[0] != p[1] {
			t.Errorf("%s got positions %v, want one place", u, p)
		}
		all = append(all, p[0])
	}
	slices.Sort(all)
	for i, p := range all {
		if p != int64(i+1) {
			t.Fatalf("positions %v, want 1..100", all)
		}
	}
	if e.obs.joined != 100 {
		t.Errorf("Observer.Joined called %d times, want 100", e.obs.joined)
	}
}

func TestPollNotInQueue(t *testing.T) {
	e := newEnv(t)
	r := e.room(t, "a")
	if _, err := r.Poll(context.Background(), Settings{SKU: "sku1"}, "nobody"); !errors.Is(err, ErrNotInQueue) {
		t.Fatalf("Poll of a buyer who never joined: %v, want ErrNotInQueue", err)
	}
	// A poll of a stranger writes nothing.
	n, err := e.client.Do(context.Background(), e.client.B().Exists().Key(r.keysOf("sku1").state, r.keysOf("sku1").members).Build()).AsInt64()
	if err != nil || n != 0 {
		t.Errorf("keys after a stranger's poll: %d, %v", n, err)
	}
}

// TestAdmission: the controller lets buyers through in order; the first
// admitted answer fixes the expiry and gives a token that verifies; the
// ETA given at the first waiting answer is compared at admission; after the
// TTL the buyer is expired.
func TestAdmission(t *testing.T) {
	e := newEnv(t)
	e.cfg.AdmissionTTL = time.Minute
	r := e.room(t, "a")
	s := Settings{SKU: "sku1", Rate: 10}
	for _, u := range users(20) {
		join(t, r, s, u)
	}
	now := e.clock.Now()
	tick(t, r, s, now) // first tick: the lease, the rate, no step yet
	w := poll(t, r, s, "user004")
	if w.State != StateWaiting || w.Position != 5 || w.Ahead != 4 || w.ETASeconds != 0.5 {
		t.Fatalf("user004 = %+v, want waiting at 5, 4 ahead, ETA 0.5 s", w)
	}
	if w.PollAfter < 400*time.Millisecond || w.PollAfter > 600*time.Millisecond {
		t.Errorf("PollAfter %v near the front, want 500ms ±20%%", w.PollAfter)
	}
	if far := poll(t, r, s, "user019"); far.ETASeconds != 2 || far.Ahead != 19 {
		t.Errorf("user019 = %+v: want 19 ahead, ETA 2 s", far)
	}
	for range 4 {
		now = e.clock.Add(100 * time.Millisecond)
		tick(t, r, s, now)
	}
	if st := poll(t, r, s, "user004"); st.State != StateWaiting || st.Ahead != 0 {
		t.Fatalf("after 4 ticks user004 = %+v, want next in line", st)
	}
	now = e.clock.Add(200 * time.Millisecond) // ETA 0.5 s, admitted at 0.6 s
	tick(t, r, s, now)
	a := poll(t, r, s, "user004")
	if a.State != StateAdmitted || !a.ExpiresAt.Equal(now.Add(time.Minute)) || a.Admission == "" {
		t.Fatalf("user004 = %+v, want admitted until %v", a, now.Add(time.Minute))
	}
	if err := r.VerifyAdmission(a.Admission, s.SKU, "user004", s.OpensAt, now); err != nil {
		t.Errorf("VerifyAdmission of a real token: %v", err)
	}
	if err := r.VerifyAdmission(a.Admission, s.SKU, "user005", s.OpensAt, now); !errors.Is(err, ErrNotAdmitted) {
		t.Errorf("VerifyAdmission for another buyer: %v", err)
	}
	if len(e.obs.etaErrors) != 1 || e.obs.etaErrors[0] < 0.09 || e.obs.etaErrors[0] > 0.11 {
		t.Errorf("EtaError %v, want one of 0.1 s (admitted 0.6 s, predicted 0.5 s)", e.obs.etaErrors)
	}
	e.clock.Add(30 * time.Second)
	if again := poll(t, r, s, "user004"); again.State != StateAdmitted || !again.ExpiresAt.Equal(a.ExpiresAt) || again.Admission != a.Admission {
		t.Errorf("second admitted poll = %+v, want the same expiry and token", again)
	}
	e.clock.Add(30 * time.Second)
	if ex := poll(t, r, s, "user004"); ex.State != StateExpired || ex.Admission != "" {
		t.Errorf("after the TTL = %+v, want expired", ex)
	}
	if err := r.VerifyAdmission(a.Admission, s.SKU, "user004", s.OpensAt, e.clock.Now()); !errors.Is(err, ErrAdmissionExpired) {
		t.Errorf("VerifyAdmission after the TTL: %v", err)
	}
	if len(e.obs.etaErrors) != 1 {
		t.Errorf("EtaError reported %d times, want once", len(e.obs.etaErrors))
	}
	st, _ := r.Stats(context.Background(), s.SKU)
	if st.Admitted != 1 || st.Served != 6 || st.Joined != 20 || st.Waiting != 14 {
		t.Errorf("Stats = %+v, want 1 admitted, 6 served, 20 joined, 14 waiting", st)
	}
}

// TestSoldOut: stock gone after the opening answers every waiting buyer
// sold_out at once (admitted buyers keep their admission); stock coming
// back reopens the room.
func TestSoldOut(t *testing.T) {
	e := newEnv(t)
	r := e.room(t, "a")
	s := Settings{SKU: "sku1"}
	us := users(20)
	for _, u := range us {
		join(t, r, s, u)
	}
	now := e.clock.Now()
	tick(t, r, s, now)
	tick(t, r, s, e.clock.Add(200*time.Millisecond)) // 2 admitted at 10/s
	if st := poll(t, r, s, us[0]); st.State != StateAdmitted {
		t.Fatalf("first buyer %+v, want admitted", st)
	}
	e.stock.set(0, true)
	tk := tick(t, r, s, e.clock.Add(100*time.Millisecond))
	if tk.Rate != 0 || tk.Served != 2 {
		t.Errorf("tick with no stock = %+v, want rate 0, served held at 2", tk)
	}
	for _, u := range us[2:] {
		if st := poll(t, r, s, u); st.State != StateSoldOut {
			t.Fatalf("%s = %+v with no stock, want sold_out", u, st)
		}
	}
	if st := join(t, r, s, "newcomer"); st.State != StateSoldOut {
		t.Errorf("join with no stock = %+v, want sold_out", st)
	}
	if st := poll(t, r, s, us[0]); st.State != StateAdmitted {
		t.Errorf("admitted buyer with no stock = %+v, want still admitted", st)
	}
	if e.obs.soldOut != 19 {
		t.Errorf("Observer.SoldOut %d, want 19", e.obs.soldOut)
	}

	e.stock.set(3, true) // an order was cancelled
	tick(t, r, s, e.clock.Add(100*time.Millisecond))
	if st := poll(t, r, s, us[5]); st.State != StateWaiting || st.ETASeconds <= 0 {
		t.Errorf("after units came back = %+v, want waiting with an ETA", st)
	}
}

// TestStockUnknown: when the stock cannot be read the controller holds
// (fail closed for admissions) and polls say the ETA is unknown.
func TestStockUnknown(t *testing.T) {
	e := newEnv(t)
	r := e.room(t, "a")
	s := Settings{SKU: "sku1"}
	for _, u := range users(5) {
		join(t, r, s, u)
	}
	e.stock.set(0, false)
	tick(t, r, s, e.clock.Now())
	tk := tick(t, r, s, e.clock.Add(200*time.Millisecond))
	if tk.Served != 0 || tk.Rate != 0 || tk.AvailKnown {
		t.Errorf("tick with unknown stock = %+v, want nothing served", tk)
	}
	if st := poll(t, r, s, "user000"); st.State != StateWaiting || st.ETASeconds != -1 || st.PollAfter < 4*time.Second {
		t.Errorf("poll with unknown stock = %+v, want waiting, ETA -1, poll in ~5 s", st)
	}
}

// TestInstanceRestart: a new Room value (a restarted instance) answers
// from Redis alone: same positions, served, admissions.
func TestInstanceRestart(t *testing.T) {
	e := newEnv(t)
	s := Settings{SKU: "sku1", OpensAt: t0.Add(time.Second)}
	r := e.room(t, "a")
	for _, u := range users(10) {
		join(t, r, s, u)
	}
	now := e.clock.Add(time.Second)
	tick(t, r, s, now)
	tick(t, r, s, e.clock.Add(200*time.Millisecond))
	before := map[string]Status{}
	for _, u := range users(10) {
		before[u] = poll(t, r, s, u)
	}
	r2 := e.room(t, "a") // same owner name: the restarted instance
	for _, u := range users(10) {
		got := poll(t, r2, s, u)
		if got.Position != before[u].Position || got.State != before[u].State || got.Admission != before[u].Admission {
			t.Errorf("%s before %+v, after restart %+v", u, before[u], got)
		}
	}
	if tk := tick(t, r2, s, e.clock.Add(100*time.Millisecond)); !tk.Leader || tk.Served != 3 {
		t.Errorf("restarted controller tick = %+v, want leader, served 3", tk)
	}
}

// TestClose: the room's keys carry a TTL while it lives and are gone after
// Close.
func TestClose(t *testing.T) {
	e := newEnv(t)
	r := e.room(t, "a")
	s := Settings{SKU: "sku1"}
	join(t, r, s, "u")
	tick(t, r, s, e.clock.Now())
	k := r.keysOf(s.SKU)
	ctx := context.Background()
	for _, key := range []string{k.state, k.members, k.lease} {
		ttl, err := e.client.Do(ctx, e.client.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil || ttl <= 0 {
			t.Errorf("PTTL %s = %d, %v; want a TTL", key, ttl, err)
		}
	}
	if err := r.Close(ctx, s.SKU); err != nil {
		t.Fatal(err)
	}
	n, err := e.client.Do(ctx, e.client.B().Exists().Key(k.state, k.members, k.lease).Build()).AsInt64()
	if err != nil || n != 0 {
		t.Errorf("%d keys left after Close (%v)", n, err)
	}
	if _, err := r.Poll(ctx, s, "u"); !errors.Is(err, ErrNotInQueue) {
		t.Errorf("Poll after Close: %v, want ErrNotInQueue", err)
	}
}

func TestNewRefuses(t *testing.T) {
	e := newEnv(t)
	ok := func(context.Context, string) (int64, bool, error) { return 0, false, nil }
	for name, cfg := range map[string]Config{
		"short key": {Prefix: "p", Key: []byte("short")},
		"no prefix": {Key: []byte("0123456789abcdef")},
		"negative":  {Prefix: "p", Key: []byte("0123456789abcdef"), Tick: -1},
	} {
		if _, err := New(e.client, cfg, nil, ok); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
	if _, err := New(e.client, Config{Prefix: "p", Key: []byte("0123456789abcdef")}, nil, nil); err == nil {
		t.Error("New accepted a nil Remaining")
	}
}
