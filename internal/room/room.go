// Package room is the waiting room of a flash sale: buyers join and poll, a
// lottery orders those who came before the opening, and an admission
// controller shared by every instance lets them through at a rate tied to
// the stock left, the share of admitted buyers who buy and the gate's
// capacity; admitted buyers get an HMAC-signed admission token.
//
// # Positions
//
// Every buyer who joins gets a join number j (1, 2, ...). At the opening
// (the sale's StartsAt) the first script to run records P, the number of
// buyers who joined before it, and a random seed (lottery.go): the buyer
// with j <= P has position perm(j-1)+1, a keyed permutation of 1..P; later
// buyers come first served (position j). The controller advances a served
// position; a buyer whose position is <= served is admitted.
//
// # Rate
//
// Each tick, the controller's leader sets
//
//	rate = min(C, avail / (conv * TTL))
//
// where C is the SKU's admission rate (Settings.Rate) or Config.DefaultRate,
// avail the units left (the Remaining callback), TTL the admission TTL and
// conv the share of admitted buyers who buy: units sold (the drops of
// avail) over positions served during the last TTL, clamped to [0.05, 1],
// 1 until 20 positions were served in the window. Below the knee avail =
// C*conv*TTL, the room admits per TTL about as many buyers as are expected
// to buy what is left. Stock unknown (Remaining fails or says so): rate 0,
// served holds (fail closed: buyers keep their place); stock <= 0 after the
// opening: every waiting buyer is answered sold_out, and if units come back
// the room opens again. docs/waiting-room.md has the whole story.
//
// # Redis
//
// Each room lives under its own hash tag, never the stock's slot:
// <prefix>:{room:<sku>}:state (hash: join counter, lottery, served, rate,
// stock seen), :members (hash: user -> join number, predicted and actual
// admission times) and :lease (the controller's holder). The first two
// expire Config.KeyTTL after the last join or tick, the lease after
// Config.LeaseTTL; Close deletes all three. A poll is O(1): HGET of the
// member and HMGET of the state in one script.
//
// # Availability
//
// Join and Poll are one Redis script call each. When the room's Redis does
// not answer within Config.Timeout they return ErrUnavailable (the caller
// answers 503: fail closed); VerifyAdmission needs no Redis, so admitted
// buyers still buy.
package room

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Errors of the waiting room; wrapped with %w, never replaced.
var (
	// ErrNotInQueue is returned by Poll when the buyer never joined the room
	// (or the room was closed since).
	ErrNotInQueue = errors.New("room: not in the waiting room")
	// ErrUnavailable is returned when the room's Redis does not answer in
	// time or fails: joins and polls fail closed (503 room_unavailable).
	ErrUnavailable = errors.New("room: waiting room unavailable")
	// ErrNotAdmitted is returned by VerifyAdmission when the token is
	// missing, malformed, forged, or issued for another buyer, SKU or opening.
	ErrNotAdmitted = errors.New("room: not admitted")
	// ErrAdmissionExpired is returned by VerifyAdmission for a genuine token
	// whose expiry has passed.
	ErrAdmissionExpired = errors.New("room: admission expired")
)

// States of a Status.
const (
	// StateWaiting: in the queue. Position 0 means the lottery of the buyers
	// who joined before the opening is not drawn yet.
	StateWaiting = "waiting"
	// StateAdmitted: the buyer may buy until ExpiresAt with the Admission token.
	StateAdmitted = "admitted"
	// StateSoldOut: the stock is gone (it may come back: poll again later).
	StateSoldOut = "sold_out"
	// StateExpired: the buyer was admitted and did not buy before the
	// admission expired. A buyer is admitted once per room.
	StateExpired = "expired"
)

// Status is a buyer's answer from Join or Poll.
type Status struct {
	State      string
	Position   int64         // 1-based place in the room; 0 before the draw
	Ahead      int64         // buyers before this one not yet admitted; -1 before the draw
	ETASeconds float64       // expected wait until admission; -1 when unknown
	PollAfter  time.Duration // when to poll again (jittered); 0 when no poll is needed
	Admission  string        // the admission token (StateAdmitted only)
	ExpiresAt  time.Time     // the token's expiry (StateAdmitted and StateExpired)
}

// Settings describe one SKU's room; they come from the sale's definition.
type Settings struct {
	SKU     string
	OpensAt time.Time // the sale's StartsAt; zero: open already
	Rate    float64   // admissions per second the gate takes for this SKU; 0: Config.DefaultRate
}

// RemainingFunc reports the units of sku left to sell. known false (or an
// error) means the stock is not known now: the controller holds admissions.
type RemainingFunc func(ctx context.Context, sku string) (units int64, known bool, err error)

// Config configures a Room. Zero fields take the defaults named.
type Config struct {
	Prefix       string        // Redis key prefix (required)
	Key          []byte        // admission token HMAC key, at least 16 bytes (required)
	AdmissionTTL time.Duration // how long an admission lasts; 2 minutes
	// Horizon is the time the rate formula spreads what is left over: the
	// room admits per Horizon about as many buyers as are expected to buy
	// the units left (rate = avail / (conv * Horizon), at most the
	// capacity). Default 10 s: admitted buyers buy within seconds, so a
	// sale empties in about that long once the crowd is in, instead of
	// trickling over a whole admission TTL.
	Horizon     time.Duration
	Tick        time.Duration // the controller's period; 200 ms
	DefaultRate float64       // admissions per second when Settings.Rate is 0; 50
	Timeout     time.Duration // per Redis call (Join, Poll, each controller step); 500 ms
	LeaseTTL    time.Duration // the controller lease; 10 ticks, at least 1 s
	KeyTTL      time.Duration // the room's keys outlive their last join or tick by this; 24 h
	Owner       string        // this instance's name in the lease; random
	Now         func() time.Time
}

// Room runs the waiting rooms of one Redis prefix. Its methods are safe for
// concurrent use; several Rooms (instances) share the same rooms through
// Redis.
type Room struct {
	c         rueidis.Client
	cfg       Config
	obs       Observer
	remaining RemainingFunc
	ctl       controllers
}

var (
	//go:embed lottery.lua
	lotteryLua string
	//go:embed queue.lua
	queueLua string
	//go:embed tick.lua
	tickLua string
	//go:embed lease.lua
	leaseLua string

	queueScript   = rueidis.NewLuaScript(lotteryLua + queueLua)
	tickScript    = rueidis.NewLuaScript(lotteryLua + tickLua)
	leaseScript   = rueidis.NewLuaScript(leaseLua)
	releaseScript = rueidis.NewLuaScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)
)

// New returns a Room on client. obs may be nil; remaining is required.
func New(client rueidis.Client, cfg Config, obs Observer, remaining RemainingFunc) (*Room, error) {
	switch {
	case client == nil:
		return nil, errors.New("room: nil Redis client")
	case remaining == nil:
		return nil, errors.New("room: nil Remaining callback")
	case cfg.Prefix == "":
		return nil, errors.New("room: empty key prefix")
	case len(cfg.Key) < 16:
		return nil, errors.New("room: admission key shorter than 16 bytes")
	case cfg.AdmissionTTL < 0, cfg.Tick < 0, cfg.DefaultRate < 0, cfg.Timeout < 0, cfg.LeaseTTL < 0, cfg.KeyTTL < 0:
		return nil, errors.New("room: negative duration or rate in Config")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.AdmissionTTL, 2*time.Minute)
	def(&cfg.Horizon, 10*time.Second)
	def(&cfg.Tick, 200*time.Millisecond)
	def(&cfg.Timeout, 500*time.Millisecond)
	def(&cfg.LeaseTTL, max(time.Second, 10*cfg.Tick))
	def(&cfg.KeyTTL, 24*time.Hour)
	if cfg.DefaultRate == 0 {
		cfg.DefaultRate = 50
	}
	if cfg.Owner == "" {
		cfg.Owner = fmt.Sprintf("room-%016x", rand.Uint64())
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if obs == nil {
		obs = nopObserver{}
	}
	cfg.Key = append([]byte(nil), cfg.Key...)
	return &Room{c: client, cfg: cfg, obs: obs, remaining: remaining, ctl: controllers{m: map[string]*controller{}}}, nil
}

// keys are a room's Redis keys: one hash tag per room, never the stock's.
type keys struct{ state, members, lease string }

func (r *Room) keysOf(sku string) keys {
	base := r.cfg.Prefix + ":{room:" + sku + "}:"
	return keys{state: base + "state", members: base + "members", lease: base + "lease"}
}

// Join puts user in s's room, or answers where the user already is
// (idempotent: a second Join is a Poll). A join while the room is sold out
// still takes a place, in case units come back.
func (r *Room) Join(ctx context.Context, s Settings, user string) (Status, error) {
	return r.queue(ctx, "join", s, user)
}

// Poll answers where user is in s's room: ErrNotInQueue if the user never
// joined. The first admitted answer fixes the admission's expiry; later
// polls return the same expiry (and StateExpired after it).
func (r *Room) Poll(ctx context.Context, s Settings, user string) (Status, error) {
	return r.queue(ctx, "poll", s, user)
}

func (r *Room) queue(ctx context.Context, mode string, s Settings, user string) (Status, error) {
	if s.SKU == "" || user == "" {
		return Status{}, errors.New("room: empty SKU or user")
	}
	now := r.cfg.Now()
	k := r.keysOf(s.SKU)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	vals, err := queueScript.Exec(cctx, r.c, []string{k.state, k.members}, []string{
		mode, user, ms(now), ms(s.OpensAt), newLotteryKeys().String(),
		ms64(r.cfg.AdmissionTTL), ms64(r.staleAfter()), strconv.FormatInt(int64(r.cfg.KeyTTL/time.Second), 10),
	}).ToArray()
	if err != nil {
		return Status{}, r.unavailable(ctx, err)
	}
	a, err := parseQueueReply(vals)
	if err != nil {
		return Status{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if a.code == 0 {
		return Status{}, ErrNotInQueue
	}
	switch a.flag {
	case 1:
		r.obs.Joined(s.SKU)
	case 2:
		if a.predicted >= 0 {
			r.obs.EtaError(s.SKU, float64(a.admitted-a.predicted)/1000)
		}
	}
	if mode == "poll" {
		r.obs.Polled(s.SKU)
	}
	return r.status(s, user, now, a), nil
}

type queueReply struct {
	code, j, pos, served int64
	rate                 float64 // -1 unknown
	predicted, admitted  int64   // ms, -1 none
	flag                 int64
}

func parseQueueReply(v []rueidis.RedisMessage) (queueReply, error) {
	var a queueReply
	if len(v) == 0 {
		return a, errors.New("empty reply from queue.lua")
	}
	var err error
	if a.code, err = v[0].AsInt64(); err != nil || a.code == 0 {
		return a, err
	}
	if len(v) != 8 {
		return a, fmt.Errorf("queue.lua returned %d values", len(v))
	}
	ints := []*int64{nil, &a.j, &a.pos, &a.served, nil, &a.predicted, &a.admitted, &a.flag}
	for i, p := range ints {
		if p == nil {
			continue
		}
		if *p, err = v[i].AsInt64(); err != nil {
			return a, err
		}
	}
	rs, err := v[4].ToString()
	if err != nil {
		return a, err
	}
	if a.rate, err = strconv.ParseFloat(rs, 64); err != nil {
		return a, err
	}
	return a, nil
}

func (r *Room) status(s Settings, user string, now time.Time, a queueReply) Status {
	switch a.code {
	case 2, 4:
		exp := time.UnixMilli(a.admitted).Add(r.cfg.AdmissionTTL)
		if a.code == 4 {
			return Status{State: StateExpired, Position: a.pos, ExpiresAt: exp, ETASeconds: 0}
		}
		return Status{
			State: StateAdmitted, Position: a.pos, ETASeconds: 0, ExpiresAt: exp,
			Admission: r.sign(s.SKU, user, s.OpensAt, exp),
		}
	case 3:
		r.obs.SoldOut(s.SKU)
		return Status{State: StateSoldOut, Position: a.pos, Ahead: max(0, a.pos-a.served-1), ETASeconds: -1,
			PollAfter: jitter(maxPoll)}
	}
	st := Status{State: StateWaiting, Position: a.pos, ETASeconds: -1}
	if a.pos == 0 {
		// Before the draw: come back around the opening.
		st.Ahead = -1
		st.PollAfter = jitter(clampPoll(s.OpensAt.Sub(now)))
		return st
	}
	st.Ahead = max(0, a.pos-a.served-1)
	if a.rate <= 0 {
		st.PollAfter = jitter(unknownPoll)
		return st
	}
	eta := float64(a.pos-a.served) / a.rate
	st.ETASeconds = eta
	st.PollAfter = jitter(clampPoll(time.Duration(eta / 4 * float64(time.Second))))
	return st
}

// Poll intervals: a quarter of the ETA within [minPoll, maxPoll], ±20 %.
const (
	minPoll     = 500 * time.Millisecond
	maxPoll     = 10 * time.Second
	unknownPoll = 5 * time.Second
)

func clampPoll(d time.Duration) time.Duration { return min(max(d, minPoll), maxPoll) }

// jitter spreads d over ±20 % so buyers told the same thing do not come
// back in the same millisecond.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// staleAfter: a rate older than this (no controller wrote it) is unknown.
func (r *Room) staleAfter() time.Duration { return max(5*r.cfg.Tick, 2*time.Second) }

// unavailable wraps a Redis failure; the caller's own cancellation stays
// itself.
func (r *Room) unavailable(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %v", ErrUnavailable, err)
}

// Stats is a room's state for dashboards and metrics.
type Stats struct {
	Joined     int64   // join numbers given
	Served     int64   // positions let through
	Waiting    int64   // Joined - Served
	Admitted   int64   // buyers who received an admitted answer
	Rate       float64 // admissions per second last written by the controller
	Avail      int64   // stock left as last seen by the controller
	AvailKnown bool
	Drawn      bool  // the opening's lottery is drawn
	Lottery    int64 // its size P
	Conv       float64
	LastTick   time.Time // the controller's last write; zero if none
}

// Stats reads sku's room state (one HMGET). A room that does not exist
// answers zeros.
func (r *Room) Stats(ctx context.Context, sku string) (Stats, error) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	f := []string{"next", "served", "issued", "rate", "avail", "P", "conv", "tick"}
	v, err := r.c.Do(cctx, r.c.B().Hmget().Key(r.keysOf(sku).state).Field(f...).Build()).ToArray()
	if err != nil {
		return Stats{}, r.unavailable(ctx, err)
	}
	str := func(i int) (string, bool) {
		s, err := v[i].ToString()
		return s, err == nil
	}
	num := func(i int) int64 {
		s, _ := str(i)
		n, _ := strconv.ParseInt(s, 10, 64)
		return n
	}
	flt := func(i int) float64 {
		s, _ := str(i)
		x, _ := strconv.ParseFloat(s, 64)
		return x
	}
	st := Stats{Joined: num(0), Served: num(1), Admitted: num(2), Rate: flt(3), Avail: num(4), Lottery: num(5), Conv: flt(6)}
	_, st.AvailKnown = str(4)
	_, st.Drawn = str(5)
	if t := num(7); t > 0 {
		st.LastTick = time.UnixMilli(t)
	}
	st.Waiting = st.Joined - st.Served
	return st, nil
}

// Close deletes sku's room (state, members, lease): every buyer is
// forgotten. Tokens already issued stay valid until they expire.
func (r *Room) Close(ctx context.Context, sku string) error {
	k := r.keysOf(sku)
	r.ctl.drop(sku)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	if err := r.c.Do(cctx, r.c.B().Del().Key(k.state, k.members, k.lease).Build()).Error(); err != nil {
		return r.unavailable(ctx, err)
	}
	return nil
}

// ms formats t as unix milliseconds; the zero time is 0 (open already).
func ms(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return strconv.FormatInt(t.UnixMilli(), 10)
}

func ms64(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
