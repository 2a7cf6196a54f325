// Package stockgate is the Redis gate: one atomic Lua script per purchase
// checks the sale window, stock and per-user limit, takes the units, remembers
// the buyer and records the reservation in an outbox that cannot be lost.
//
// Keys of one SKU share the hash tag {sku_id}, so every script touches one
// Redis Cluster slot:
//
//	<prefix>:{sku}:meta    hash  avail, debt, limit, starts, ends, reserved, moves, epoch,
//	                             inflight (units in res), cfloor (closed markers dropped below), seeding
//	<prefix>:{sku}:buyers  hash  user -> units held
//	<prefix>:{sku}:res     hash  order_id -> reservation JSON (in flight)
//	<prefix>:{sku}:outbox  zset  order_id by accepted ms (not yet in the stream)
//	<prefix>:{sku}:idem    hash  user NUL Idempotency-Key -> order_id; '#' order_id -> 1 (closed)
//	<prefix>:{sku}:closed  zset  closed order ids by accepted ms (the '#' markers, dropped after ClosedRetention)
//	<prefix>:{sku}:rel     set   order ids whose release was restored here
//	<prefix>:{sku}:lock    string the token of the instance changing the SKU (LockSKU)
//	<prefix>:skus          set   SKUs loaded (scanned by the relay)
package stockgate

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
)

var (
	//go:embed reserve.lua
	reserveLua string
	//go:embed finalize.lua
	finalizeLua string
	//go:embed seed.lua
	seedLua string
	//go:embed inflight.lua
	inflightLua string
	//go:embed resync.lua
	resyncLua string
	//go:embed adjust.lua
	adjustLua string
	//go:embed expire.lua
	expireLua string
	//go:embed fence.lua
	fenceLua string
	//go:embed restore.lua
	restoreLua string
	// debt.lua defines give and take, the gate's debt rules; it is put in
	// front of each script that moves units from outside the purchase path.
	//go:embed debt.lua
	debtLua string
)

// Gate is the Redis side of the purchase path. It is safe for concurrent use.
type Gate struct {
	c        rueidis.Client
	prefix   string
	closedMs int64 // ClosedRetention in ms
	reserve  *rueidis.Lua
	finalize *rueidis.Lua
	seed     *rueidis.Lua
	inflight *rueidis.Lua
	resync   *rueidis.Lua
	adjust   *rueidis.Lua
	expire   *rueidis.Lua
	fence    *rueidis.Lua
	restore  *rueidis.Lua
	keys     keyLookups    // Duplicate's coalesced look-ups (keylookup.go)
	xferWait time.Duration // see SetTransferWait
	replicas sync.Map      // bucket name -> replicaSeen (durable.go)
}

// New returns a Gate on client c whose keys all start with prefix + ":".
// Scripts run by EVALSHA with a NOSCRIPT fallback (they survive a Redis restart).
// rueidis does not retry scripts, so an error never means "ran twice".
func New(c rueidis.Client, prefix string) *Gate {
	return &Gate{
		c:        c,
		prefix:   prefix,
		closedMs: DefaultClosedRetention.Milliseconds(),
		reserve:  rueidis.NewLuaScript(reserveLua),
		finalize: rueidis.NewLuaScript(debtLua + finalizeLua),
		seed:     rueidis.NewLuaScript(seedLua),
		inflight: rueidis.NewLuaScriptReadOnly(inflightLua),
		resync:   rueidis.NewLuaScript(resyncLua),
		adjust:   rueidis.NewLuaScript(debtLua + adjustLua),
		expire:   rueidis.NewLuaScript(expireLua),
		fence:    rueidis.NewLuaScript(fenceLua),
		restore:  rueidis.NewLuaScript(debtLua + restoreLua),
		xferWait: DefaultTransferWait,
	}
}

// DefaultClosedRetention is how long a closed order id is remembered by
// default (see SetClosedRetention).
const DefaultClosedRetention = 2 * time.Minute

// SetClosedRetention sets how long the gate remembers that an order id was
// closed (its '#' marker in the idem hash, indexed by the closed zset), so
// that a retry of a reserve call with the same order id is a duplicate and
// not a new reservation. Markers of reservations accepted longer ago are
// dropped by Finalize; a reserve call of a reservation accepted before the
// dropped ones returns ErrClosedForgotten (ask the database). The purchase
// path retries an order id only within a few gate timeouts, so minutes are
// plenty. Call it before the gate is used.
func (g *Gate) SetClosedRetention(d time.Duration) { g.closedMs = d.Milliseconds() }

// ErrClosedForgotten is returned by Reserve for a reservation accepted
// before the oldest closed marker the gate still remembers (see
// SetClosedRetention): it may have been reserved and closed already. The
// database knows: an order with that id exists or it was never reserved.
var ErrClosedForgotten = errors.New("stockgate: reservation older than the closed-order retention")

// Keys names the Redis keys of one SKU.
type Keys struct{ Meta, Buyers, Res, Outbox, Idem, Rel, Lock, Closed string }

// KeysOf returns the keys of sku.
func (g *Gate) KeysOf(sku string) Keys {
	base := g.prefix + ":{" + sku + "}:"
	return Keys{Meta: base + "meta", Buyers: base + "buyers", Res: base + "res", Outbox: base + "outbox", Idem: base + "idem", Rel: base + "rel",
		Lock: base + "lock", Closed: base + "closed"}
}

func (g *Gate) registry() string { return g.prefix + ":skus" }

// ReserveResult is what the gate decided for an admitted purchase.
type ReserveResult struct {
	OrderID string
	// Duplicate is true when the Idempotency-Key (or order id) already made
	// OrderID: nothing new was reserved.
	Duplicate bool
	// Available is the number of units left after this reservation (0 for duplicates).
	Available int64
	// Payload is the reservation as recorded in the outbox (nil for duplicates).
	Payload []byte
}

// Reserve admits r atomically or refuses it, with no rate limit (see
// ReserveLimited). r.OrderID and r.AcceptedAt must be set by the caller; r is
// stored as the outbox payload. Errors: sale.ErrSoldOut (a *SoldOutError),
// sale.ErrLimitReached, sale.ErrSaleNotOpen, sale.ErrSaleEnded,
// sale.ErrNotWarmed (nothing known for the SKU: never sell against it), and
// transport errors, whose outcome is unknown: the reservation may exist (look
// it up with Lookup or retry with the same order id or Idempotency-Key),
// never assume it failed.
func (g *Gate) Reserve(ctx context.Context, r sale.Reservation) (ReserveResult, error) {
	return g.ReserveLimited(ctx, r, Limits{})
}

// Rate is one distributed rate limit: PerSecond requests sustained, up to
// Burst at once. A zero PerSecond disables it; Burst below 1 counts as 1.
type Rate struct {
	PerSecond float64
	Burst     int
}

// On reports whether the limit is enabled.
func (r Rate) On() bool { return r.PerSecond > 0 }

// args returns the script arguments of r: emission interval in µs, burst.
func (r Rate) args() (string, string) {
	if !r.On() {
		return "0", "0"
	}
	iv := int64(math.Round(1e6 / r.PerSecond))
	return strconv.FormatInt(max(iv, 1), 10), strconv.Itoa(max(r.Burst, 1))
}

// Limits are the distributed rate limits ReserveLimited checks in the same
// script call as the stock (GCRA on the Redis server's clock, so every
// instance shares one budget). Their keys live under the SKU's hash tag, so
// the user and IP limits count per SKU.
type Limits struct {
	SKU, User, IP Rate
	// IPKey identifies the client for the IP limit (an address or a
	// network such as an IPv6 /64); empty skips the IP limit.
	IPKey string
	// Buckets is the number of stock buckets the caller believes the sale
	// is split in (0 or 1: not split); see ReserveIn. Not a rate limit,
	// but it travels with the purchase's gate call.
	Buckets int
}

// SoldOutError is the sale.ErrSoldOut the gate returns: Available units
// were left, fewer than asked for.
type SoldOutError struct{ Available int64 }

func (e *SoldOutError) Error() string { return sale.ErrSoldOut.Error() }

// Is makes errors.Is(err, sale.ErrSoldOut) true.
func (e *SoldOutError) Is(target error) bool { return target == sale.ErrSoldOut }

// limitKeys returns the keys of the SKU, user and IP limits of a purchase.
func (g *Gate) limitKeys(sku, user, ipKey string) [3]string {
	base := g.prefix + ":{" + sku + "}:rl:"
	return [3]string{base + "sku", base + "u:" + user, base + "ip:" + ipKey}
}

// ReserveLimited is Reserve behind the rate limits l, checked in the same
// atomic script call before anything is written. A request a limit refuses
// changes nothing and gets a *LimitedError (sale.ErrRateLimited, unwrapping
// to the *sale.RateLimitError of the limit that frees last). Every other request counts against the limits,
// except a repeat of an order id the gate already holds (a retry of a call
// whose reply was lost).
func (g *Gate) ReserveLimited(ctx context.Context, r sale.Reservation, l Limits) (ReserveResult, error) {
	return g.ReserveIn(ctx, r, l, l.Buckets)
}

// ReserveIn is ReserveLimited of a sale the caller believes split in k
// stock buckets (1 or less: not split). The reservation is made in the
// buyer's home bucket (r.Bucket is set to it, HomeName); units move to it
// from the other buckets when it has too few, and sale.ErrSoldOut means
// the buckets together had fewer than asked for. A sale split otherwise
// in Redis gives ErrBucketsChanged, nothing written.
func (g *Gate) ReserveIn(ctx context.Context, r sale.Reservation, l Limits, k int) (ReserveResult, error) {
	k = max(k, 1)
	r.Bucket = ""
	if k > 1 {
		r.Bucket = HomeName(r.SKU, r.User, k)
		return g.reserveBuckets(ctx, r, l, k)
	}
	return g.reserveIn(ctx, r, l, k)
}

// reserveIn is one reserve script call in r's bucket.
func (g *Gate) reserveIn(ctx context.Context, r sale.Reservation, l Limits, k int) (ReserveResult, error) {
	if err := r.Validate(); err != nil {
		return ReserveResult{}, fmt.Errorf("%w: %v", sale.ErrInvalid, err)
	}
	payload, err := json.Marshal(r)
	if err != nil {
		return ReserveResult{}, err
	}
	name := BucketOf(r)
	keys := g.KeysOf(name)
	idem := ""
	if r.IdempotencyKey != "" {
		idem = r.User + "\x00" + r.IdempotencyKey
	}
	ip := l.IP
	if l.IPKey == "" {
		ip = Rate{}
	}
	ks := []string{keys.Meta, keys.Buyers, keys.Res, keys.Outbox, keys.Idem}
	args := []string{r.OrderID, r.User, strconv.FormatInt(r.Quantity, 10), strconv.FormatInt(r.AcceptedAt, 10), idem, string(payload)}
	if l.SKU.On() || l.User.On() || ip.On() {
		lk := g.limitKeys(name, r.User, l.IPKey)
		skuIv, skuBurst := l.SKU.args()
		userIv, userBurst := l.User.args()
		ipIv, ipBurst := ip.args()
		ks = append(ks, lk[0], lk[1], lk[2])
		args = append(args, skuIv, skuBurst, userIv, userBurst, ipIv, ipBurst)
	}
	args = append(args, strconv.Itoa(k))
	vals, err := g.reserve.Exec(ctx, g.c, ks, args).ToArray()
	if err != nil {
		return ReserveResult{}, fmt.Errorf("stockgate: reserve: %w", err)
	}
	code, err := vals[0].AsInt64()
	if err != nil {
		return ReserveResult{}, fmt.Errorf("stockgate: reserve reply: %w", err)
	}
	switch code {
	case 1:
		avail, _ := vals[2].AsInt64()
		return ReserveResult{OrderID: r.OrderID, Available: avail, Payload: payload}, nil
	case 2:
		id, _ := vals[1].ToString()
		return ReserveResult{OrderID: id, Duplicate: true}, nil
	case 0:
		avail, _ := vals[1].AsInt64()
		return ReserveResult{}, &SoldOutError{Available: avail}
	case -1:
		return ReserveResult{}, sale.ErrLimitReached
	case -2:
		return ReserveResult{}, sale.ErrNotWarmed
	case -3:
		return ReserveResult{}, sale.ErrSaleNotOpen
	case -4:
		return ReserveResult{}, sale.ErrSaleEnded
	case -6:
		return ReserveResult{}, rateLimited(vals[1:])
	case -7:
		return ReserveResult{}, ErrClosedForgotten
	case -8:
		return ReserveResult{}, ErrBucketsChanged
	}
	return ReserveResult{}, fmt.Errorf("stockgate: reserve: unexpected code %d", code)
}

// LimitedError is the sale.ErrRateLimited of ReserveLimited: how long each
// limit goes on refusing (0: that limit passed). It unwraps to the
// *sale.RateLimitError of the limit that frees last.
type LimitedError struct{ SKU, User, IP time.Duration }

func (e *LimitedError) Error() string { return e.Unwrap().Error() }

// Unwrap returns the *sale.RateLimitError of the limit that frees last.
func (e *LimitedError) Unwrap() error {
	r := &sale.RateLimitError{Scope: "sku", RetryAfter: e.SKU}
	if e.User > r.RetryAfter {
		r.Scope, r.RetryAfter = "user", e.User
	}
	if e.IP > r.RetryAfter {
		r.Scope, r.RetryAfter = "ip", e.IP
	}
	return r
}

// rateLimited turns the script's waits (ms per limit: SKU, user, IP) into a *LimitedError.
func rateLimited(waits []rueidis.RedisMessage) error {
	var d [3]time.Duration
	for i := range min(len(waits), 3) {
		ms, _ := waits[i].AsInt64()
		d[i] = time.Duration(ms) * time.Millisecond
	}
	return &LimitedError{SKU: d[0], User: d[1], IP: d[2]}
}

// Outcome is the database's decision on a reservation, as the gate closes it.
type Outcome struct {
	OrderID string
	// Refused is true when the database refused it: its units and the buyer's
	// slot go back to Redis.
	Refused bool
	// KeyOrderID, on a refusal because the reservation's Idempotency-Key had
	// already made another order, is that order: the key is pointed at it,
	// so a retry of the key is answered with the order the database kept.
	KeyOrderID string
}

// Finalize closes reservations of sku (a bucket name, BucketOf, for a sale
// split in buckets) the database has decided: applied ones
// are forgotten (their units stay sold), refused ones give their units and
// buyer slot back. Exactly once per reservation, however often it is called:
// the in-flight entry is the token. Returns the units given back.
func (g *Gate) Finalize(ctx context.Context, sku string, outcomes []Outcome) (units int64, err error) {
	if len(outcomes) == 0 {
		return 0, nil
	}
	args := make([]string, 0, 2+2*len(outcomes))
	args = append(args, strconv.FormatInt(time.Now().UnixMilli(), 10), strconv.FormatInt(g.closedMs, 10))
	for _, o := range outcomes {
		flag := "a"
		switch {
		case o.Refused && o.KeyOrderID != "":
			flag = "k" + o.KeyOrderID
		case o.Refused:
			flag = "f"
		}
		args = append(args, o.OrderID, flag)
	}
	k := g.KeysOf(sku)
	vals, err := g.finalize.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Res, k.Outbox, k.Idem, g.acceptedKey(sku), k.Closed}, args).AsIntSlice()
	if err != nil {
		return 0, fmt.Errorf("stockgate: finalize: %w", err)
	}
	if vals[1] > 0 {
		// Units given back in one bucket of a split sale may owe another's
		// debt. Best effort: the outcomes are closed whatever happens here,
		// and the transfer sweeper settles debts every second.
		_ = g.settleAfter(ctx, sku)
	}
	return vals[1], nil
}

// Config is the sale configuration the gate enforces.
type Config struct {
	PerUserLimit     int64
	StartsAt, EndsAt time.Time
	// Lock is the token of the SKU's change lock (LockSKU) the caller
	// holds, or "" for none. Seed, Resync and Adjust given a token write
	// only while that token still holds the lock (fencing): a holder whose
	// lock expired gets ErrLockLost and changes nothing.
	Lock string
}

// ConfigOf returns the gate configuration of s.
func ConfigOf(s sale.SKU) Config {
	return Config{PerUserLimit: s.PerUserLimit, StartsAt: s.StartsAt, EndsAt: s.EndsAt}
}

func ms(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return strconv.FormatInt(t.UnixMilli(), 10)
}

// Seed loads a SKU that Redis does not hold: available units,
// configuration, the buyers' holdings (user -> units of live orders and of
// reservations in flight) and the reservations in flight (recorded again so
// that their outcome can still be closed exactly once). It returns false and
// changes nothing if the SKU is already loaded (use Resync then). idem maps
// user NUL Idempotency-Key to the order it made, so that a retry after a
// reload still returns the same order.
//
// A large sale is written in chunks of about SeedChunk entries per script
// call (Redis serves other calls between them); the SKU stays unloaded,
// refused by the gate, until the last chunk marks it loaded.
func (g *Gate) Seed(ctx context.Context, sku string, cfg Config, available int64, holdings map[string]int64, inflight []sale.Reservation, released []Release, idem map[string]string, epoch string) (bool, error) {
	k := g.KeysOf(sku)
	var chunks []seedChunk
	cur := &seedChunk{}
	next := func() {
		if cur.entries >= SeedChunk {
			chunks = append(chunks, *cur)
			cur = &seedChunk{}
		}
	}
	// Holdings, releases and keys first, then reservations oldest first
	// (the order seed.lua records their keys in), each kind in its own
	// section of a chunk.
	for _, u := range slices.Sorted(maps.Keys(holdings)) {
		next()
		cur.buyers = append(cur.buyers, u, strconv.FormatInt(holdings[u], 10))
		cur.entries++
	}
	for _, r := range released {
		next()
		cur.rel = append(cur.rel, r.OrderID)
		cur.entries++
	}
	for _, key := range slices.Sorted(maps.Keys(idem)) {
		next()
		cur.idem = append(cur.idem, key, idem[key])
		cur.entries++
	}
	for _, r := range inflight {
		b, err := json.Marshal(r)
		if err != nil {
			return false, err
		}
		next()
		cur.res = append(cur.res, r.OrderID, string(b))
		cur.entries++
	}
	chunks = append(chunks, *cur)
	token := epoch + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var n int64
	for i, c := range chunks {
		phase := "m"
		switch {
		case len(chunks) == 1:
			phase = "o"
		case i == 0:
			phase = "f"
		case i == len(chunks)-1:
			phase = "l"
		}
		args := make([]string, 0, 11+len(c.buyers)+len(c.rel)+len(c.idem)+len(c.res))
		args = append(args, strconv.FormatInt(available, 10), strconv.FormatInt(cfg.PerUserLimit, 10), ms(cfg.StartsAt), ms(cfg.EndsAt), epoch,
			strconv.Itoa(len(c.buyers)/2), strconv.Itoa(len(c.rel)), strconv.Itoa(len(c.idem)/2), cfg.Lock, token, phase)
		args = append(append(append(append(args, c.buyers...), c.rel...), c.idem...), c.res...)
		var err error
		n, err = g.seed.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Res, k.Rel, k.Idem, k.Lock}, args).AsInt64()
		if err != nil {
			return false, fmt.Errorf("stockgate: seed: %w", err)
		}
		switch n {
		case -5:
			return false, ErrLockLost
		case -6:
			return false, ErrSeedTakenOver
		case 0:
			return false, nil // loaded meanwhile (another instance's seed)
		}
		if afterSeedChunk != nil && i < len(chunks)-1 {
			afterSeedChunk(i)
		}
	}
	if n == 1 {
		if err := g.Register(ctx, sku); err != nil {
			return true, fmt.Errorf("stockgate: register: %w", err)
		}
	}
	return n == 1, nil
}

// SeedChunk is about how many entries (buyers, releases, keys, reservations)
// one seed script call writes.
var SeedChunk = 1000

// afterSeedChunk, if set (tests), is called after each chunk but the last.
var afterSeedChunk func(i int)

// seedChunk is one seed.lua call's share of a load.
type seedChunk struct {
	buyers, rel, idem, res []string
	entries                int
}

// ErrSeedTakenOver is returned by Seed when another load of the SKU started
// while this one was writing its chunks: this one stops, the other goes on.
var ErrSeedTakenOver = errors.New("stockgate: another seed of the sku took over")

// Fence unloads sku: the gate refuses it (sale.ErrNotWarmed) until Seed
// loads it again. In-flight entries and the reserved counter are kept.
func (g *Gate) Fence(ctx context.Context, sku string) error {
	if err := g.fence.Exec(ctx, g.c, []string{g.KeysOf(sku).Meta}, nil).Error(); err != nil {
		return fmt.Errorf("stockgate: fence: %w", err)
	}
	return nil
}

// InFlight is an atomic read of a SKU's reservations not yet closed.
type InFlight struct {
	Loaded   bool
	Epoch    string // which load of the SKU this read saw
	Reserved int64  // the monotonic reserved-units counter at the time of the read
	// Available is what the gate may still sell net of its debt: the
	// units owed because a stock decrement made outside the gate (an
	// external change, a direct sale) took more than was available. It is
	// negative while the debt exceeds the available units.
	Available int64
	// Debt is that debt: reservations already admitted that the database
	// will refuse; their give-back pays it off instead of re-selling.
	Debt int64
	// Moves is the SKU's move counter at the time of the read: bumped by
	// every change of the available units or the debt other than a
	// reservation (those are counted by Reserved).
	Moves        int64
	Reservations []sale.Reservation
}

// Gauges are a SKU's figures for the dashboard and the metrics, read
// without reading a reservation.
type Gauges struct {
	Loaded    bool
	Available int64 // avail - debt (see InFlight), when Loaded
	InFlight  int64 // reservations in flight (entries of res)
	Units     int64 // their units
	Outbox    int64 // reservations not yet acknowledged by the stream
}

// ReadGauges returns sku's gauges in one round trip that reads no entry:
// the length of res and the meta hash's running count of their units (kept
// by the scripts that add or remove entries). A split sale's are the sum
// over its buckets, read in one more round trip (pipelined, whatever the
// number of buckets). A SKU loaded by an older version has no count until
// its next seed or resync: then the entries are read (ReadInFlight).
func (g *Gate) ReadGauges(ctx context.Context, sku string) (Gauges, error) {
	gs, k, err := g.gaugesFrom(ctx, sku, g.c.DoMulti(ctx, g.gaugeCmds(sku)...))
	if err != nil || k <= 1 {
		return gs, err
	}
	// A split sale: the sum over its buckets (bucket 0 is sku itself).
	names := BucketNames(sku, k)[1:]
	cmds := make(rueidis.Commands, 0, 3*len(names))
	for _, name := range names {
		cmds = append(cmds, g.gaugeCmds(name)...)
	}
	rs := g.c.DoMulti(ctx, cmds...)
	for i, name := range names {
		b, _, err := g.gaugesFrom(ctx, name, rs[3*i:3*i+3])
		if err != nil {
			return Gauges{}, err
		}
		gs.Loaded = gs.Loaded && b.Loaded
		gs.Available += b.Available
		gs.InFlight += b.InFlight
		gs.Units += b.Units
		gs.Outbox += b.Outbox
	}
	return gs, nil
}

// gaugeCmds are the three reads of one bucket's (or an unsplit sale's)
// gauges, in the order gaugesFrom takes their answers.
func (g *Gate) gaugeCmds(name string) rueidis.Commands {
	k := g.KeysOf(name)
	return rueidis.Commands{g.c.B().Hlen().Key(k.Res).Build(),
		g.c.B().Hmget().Key(k.Meta).Field("inflight", "avail", "debt", "epoch", "buckets").Build(), g.c.B().Zcard().Key(k.Outbox).Build()}
}

// gaugesFrom is ReadGauges of one bucket (or of a sale not split) from the
// answers to gaugeCmds(name), with the number of buckets its meta hash
// records.
func (g *Gate) gaugesFrom(ctx context.Context, name string, rs []rueidis.RedisResult) (Gauges, int, error) {
	n, err := rs[0].AsInt64()
	if err != nil {
		return Gauges{}, 0, fmt.Errorf("stockgate: gauges: %w", err)
	}
	m, err := rs[1].ToArray()
	if err != nil || len(m) != 5 {
		return Gauges{}, 0, fmt.Errorf("stockgate: gauges: %w", err)
	}
	out, err := rs[2].AsInt64()
	if err != nil {
		return Gauges{}, 0, fmt.Errorf("stockgate: gauges: %w", err)
	}
	buckets := 1
	if b, err := m[4].AsInt64(); err == nil && b > 1 {
		buckets = int(b)
	}
	units, uerr := m[0].AsInt64()
	if rueidis.IsRedisNil(uerr) {
		f, err := g.ReadInFlightOf(ctx, name)
		if err != nil {
			return Gauges{}, 0, err
		}
		return Gauges{Loaded: f.Loaded, Available: f.Available, InFlight: int64(len(f.Reservations)), Units: f.Units(), Outbox: out}, buckets, nil
	}
	gs := Gauges{InFlight: n, Units: units, Outbox: out}
	gs.Loaded = !m[3].IsNil()
	avail, _ := m[1].AsInt64()
	debt, _ := m[2].AsInt64()
	gs.Available = avail - debt
	return gs, buckets, nil
}

// Units returns the total quantity of the reservations.
func (f InFlight) Units() int64 {
	var n int64
	for _, r := range f.Reservations {
		n += r.Quantity
	}
	return n
}

// ReadInFlight returns, in one atomic step, the SKU's in-flight reservations,
// its reserved counter and available units (entries are returned even when
// the SKU is not loaded).
func (g *Gate) ReadInFlight(ctx context.Context, sku string) (InFlight, error) {
	if n, err := g.Buckets(ctx, sku); err != nil {
		return InFlight{}, err
	} else if n > 1 {
		return g.readInFlightBuckets(ctx, sku, n)
	}
	return g.ReadInFlightOf(ctx, sku)
}

// ReadInFlightOf is ReadInFlight of one bucket (or of a sale not split).
func (g *Gate) ReadInFlightOf(ctx context.Context, sku string) (InFlight, error) {
	k := g.KeysOf(sku)
	vals, err := g.inflight.Exec(ctx, g.c, []string{k.Meta, k.Res}, nil).ToArray()
	if err != nil {
		return InFlight{}, fmt.Errorf("stockgate: read in-flight: %w", err)
	}
	loaded, _ := vals[0].AsInt64()
	var f InFlight
	f.Loaded = loaded == 1
	f.Reserved, _ = vals[1].AsInt64()
	f.Available, _ = vals[2].AsInt64()
	if len(vals) > 4 {
		f.Epoch, _ = vals[4].ToString()
	}
	f.Debt, _ = vals[5].AsInt64()
	if len(vals) > 6 {
		f.Moves, _ = vals[6].AsInt64()
	}
	kv, err := vals[3].AsStrSlice()
	if err != nil {
		return InFlight{}, fmt.Errorf("stockgate: read in-flight: %w", err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		var r sale.Reservation
		if err := json.Unmarshal([]byte(kv[i+1]), &r); err != nil {
			return InFlight{}, fmt.Errorf("stockgate: in-flight entry %s: %w", kv[i], err)
		}
		f.Reservations = append(f.Reservations, r)
	}
	return f, nil
}

// Resync sets a loaded SKU's available units from a database snapshot taken
// after f was read: available = dbStock - (units of f not processed) -
// (units reserved since f was read). processed maps the ids of f the database
// has decided to true when refused; those entries are closed here. released
// are the releases whose Redis restore the snapshot shows pending: dbStock
// includes their units, so they are marked restored (buyer slot given back)
// and a later Restore of them does nothing.
// It returns the units the gate may now sell net of its debt (negative when
// the database has fewer units than are in flight), or sale.ErrNotWarmed
// when the SKU is not loaded.
func (g *Gate) Resync(ctx context.Context, sku string, cfg Config, f InFlight, dbStock int64, processed map[string]bool, released []Release) (int64, error) {
	var pending int64
	args := []string{strconv.FormatInt(dbStock, 10), strconv.FormatInt(f.Reserved, 10), "",
		strconv.FormatInt(cfg.PerUserLimit, 10), ms(cfg.StartsAt), ms(cfg.EndsAt), "", f.Epoch,
		strconv.FormatInt(f.Moves, 10), cfg.Lock}
	nproc := 0
	for _, r := range f.Reservations {
		refused, done := processed[r.OrderID]
		if !done {
			pending += r.Quantity
			continue
		}
		flag := "a"
		if refused {
			flag = "f"
		}
		args = append(args, r.OrderID, flag)
		nproc++
	}
	args[2], args[6] = strconv.FormatInt(pending, 10), strconv.Itoa(nproc)
	for _, r := range released {
		args = append(args, r.OrderID, r.User, strconv.FormatInt(r.Quantity, 10))
	}
	k := g.KeysOf(sku)
	vals, err := g.resync.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Res, k.Outbox, k.Rel, k.Idem, k.Lock, k.Closed}, args).AsIntSlice()
	if err != nil {
		return 0, fmt.Errorf("stockgate: resync: %w", err)
	}
	switch vals[0] {
	case -2:
		return 0, sale.ErrNotWarmed
	case -3:
		return 0, ErrReseeded
	case -4:
		return 0, ErrMoved
	case -5:
		return 0, ErrLockLost
	}
	return vals[0] - vals[1], nil // available net of debt
}

// ErrReseeded is returned by Resync when the SKU was loaded again (a rebuild,
// a Redis that lost its data) after the in-flight read it was given: read
// again and retry.
var ErrReseeded = errors.New("stockgate: sku re-seeded since the in-flight read")

// ErrMoved is returned by Resync when units moved in Redis since the
// in-flight read it was given (a refusal or release given back, a debit of
// a fallback sale or of an outside decrement, an admin change): the
// database snapshot may not include the move, or include it twice. Nothing
// was written: read again and retry.
var ErrMoved = errors.New("stockgate: units moved since the in-flight read")

// ErrLockLost is returned by Seed, Resync and Adjust when the change lock
// token the caller passed no longer holds the SKU's lock (it expired, or
// another instance took it over): nothing was written.
var ErrLockLost = errors.New("stockgate: the sku's change lock is no longer held")

// Adjust changes a loaded SKU's available units by delta and sets its
// configuration. A reduction larger than the units available is refused with
// sale.ErrStockConflict (units already reserved are never taken back);
// sale.ErrNotWarmed when the SKU is not loaded.
func (g *Gate) Adjust(ctx context.Context, sku string, cfg Config, delta int64) (int64, error) {
	k := g.KeysOf(sku)
	vals, err := g.adjust.Exec(ctx, g.c, []string{k.Meta, k.Lock},
		[]string{strconv.FormatInt(delta, 10), strconv.FormatInt(cfg.PerUserLimit, 10), ms(cfg.StartsAt), ms(cfg.EndsAt), cfg.Lock},
	).AsIntSlice()
	if err != nil {
		return 0, fmt.Errorf("stockgate: adjust: %w", err)
	}
	switch vals[0] {
	case -5:
		return 0, ErrLockLost
	case -2:
		return 0, sale.ErrNotWarmed
	case 0:
		return vals[1], fmt.Errorf("%w: %d units available in redis, reduction of %d", sale.ErrStockConflict, vals[1], -delta)
	}
	return vals[1], nil
}

// Available returns the units available in Redis (for a split sale the sum
// over its buckets, units in transfer included); ok is false when the SKU
// is not loaded.
func (g *Gate) Available(ctx context.Context, sku string) (n int64, ok bool, err error) {
	// One read for a sale in one bucket: its avail and its number of buckets.
	m, err := g.c.Do(ctx, g.c.B().Hmget().Key(g.KeysOf(sku).Meta).Field("avail", "buckets").Build()).ToArray()
	if err != nil {
		return 0, false, fmt.Errorf("stockgate: available: %w", err)
	}
	if k, err := m[1].AsInt64(); err == nil && k > 1 {
		bs, err := g.ReadBuckets(ctx, BucketNames(sku, int(k)), false)
		if err != nil {
			return 0, false, err
		}
		for _, b := range bs {
			if !b.Loaded {
				return 0, false, nil
			}
			n += b.Avail + b.Transit
		}
		return n, true, nil
	}
	n, err = m[0].AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("stockgate: available: %w", err)
	}
	return n, true, nil
}

// Held returns the units user holds of sku according to Redis.
func (g *Gate) Held(ctx context.Context, sku, user string) (int64, error) {
	k, err := g.Buckets(ctx, sku)
	if err != nil {
		return 0, err
	}
	n, err := g.c.Do(ctx, g.c.B().Hget().Key(g.KeysOf(HomeName(sku, user, k)).Buyers).Field(user).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return n, err
}

// Lookup returns the in-flight reservation orderID of any of skus, if one
// holds it. One round trip asks every SKU's bucket 0 and its bucket count
// at once (the look-ups of several SKUs are pipelined); only a split sale
// whose bucket 0 does not hold the order costs a second, asking its other
// buckets.
func (g *Gate) Lookup(ctx context.Context, orderID string, skus ...string) (sale.Reservation, bool, error) {
	cmds := make(rueidis.Commands, 0, 2*len(skus))
	for _, sku := range skus {
		k := g.KeysOf(sku)
		cmds = append(cmds, g.c.B().Hget().Key(k.Res).Field(orderID).Build(),
			g.c.B().Hget().Key(k.Meta).Field("buckets").Build())
	}
	b, more, err := g.firstHeld(ctx, cmds, func(i int) bool { return i%2 == 0 })
	if err != nil {
		return sale.Reservation{}, false, err
	}
	if b == nil && len(more) > 0 {
		// more holds the bucket-count answers: ask the split sales' other buckets.
		cmds = cmds[:0]
		for i, sku := range skus {
			n, err := more[2*i+1].AsInt64()
			if err != nil || n <= 1 {
				continue
			}
			for _, name := range BucketNames(sku, int(n))[1:] {
				cmds = append(cmds, g.c.B().Hget().Key(g.KeysOf(name).Res).Field(orderID).Build())
			}
		}
		if len(cmds) > 0 {
			if b, _, err = g.firstHeld(ctx, cmds, func(int) bool { return true }); err != nil {
				return sale.Reservation{}, false, err
			}
		}
	}
	if b == nil {
		return sale.Reservation{}, false, nil
	}
	var r sale.Reservation
	if err := json.Unmarshal(b, &r); err != nil {
		return sale.Reservation{}, false, fmt.Errorf("stockgate: lookup %s: %w", orderID, err)
	}
	return r, true, nil
}

// firstHeld sends cmds at once and returns the first answer of a command
// picked by isRes that holds a value; with none, every answer (to read the
// others from).
func (g *Gate) firstHeld(ctx context.Context, cmds rueidis.Commands, isRes func(int) bool) ([]byte, []rueidis.RedisResult, error) {
	rs := g.c.DoMulti(ctx, cmds...)
	for i, r := range rs {
		if !isRes(i) {
			continue
		}
		v, err := r.AsBytes()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("stockgate: lookup: %w", err)
		}
		return v, nil, nil
	}
	return nil, rs, nil
}

// Pending is an outbox entry: a reservation not yet acknowledged by the stream.
type Pending struct {
	OrderID string
	Payload []byte // nil if the reservation is already closed (just drop the entry)
}

// Outbox returns up to limit outbox entries of sku accepted at or before before.
func (g *Gate) Outbox(ctx context.Context, sku string, before time.Time, limit int) ([]Pending, error) {
	k := g.KeysOf(sku)
	ids, err := g.c.Do(ctx, g.c.B().Zrange().Key(k.Outbox).Min("-inf").Max(strconv.FormatInt(before.UnixMilli(), 10)).
		Byscore().Limit(0, int64(limit)).Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("stockgate: outbox: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	vals, err := g.c.Do(ctx, g.c.B().Hmget().Key(k.Res).Field(ids...).Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("stockgate: outbox payloads: %w", err)
	}
	out := make([]Pending, len(ids))
	for i, id := range ids {
		out[i].OrderID = id
		if b, err := vals[i].AsBytes(); err == nil {
			out[i].Payload = b
		}
	}
	return out, nil
}

// OutboxLen returns the number of outbox entries of sku.
// For a sale split in buckets, it is the sum over them.
func (g *Gate) OutboxLen(ctx context.Context, sku string) (int64, error) {
	k, err := g.Buckets(ctx, sku)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, n := range BucketNames(sku, k) {
		v, err := g.c.Do(ctx, g.c.B().Zcard().Key(g.KeysOf(n).Outbox).Build()).AsInt64()
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total, nil
}

// SKUs returns the SKUs loaded in Redis (the relay's work list).
func (g *Gate) SKUs(ctx context.Context) ([]string, error) {
	return g.c.Do(ctx, g.c.B().Smembers().Key(g.registry()).Build()).AsStrSlice()
}

// Register adds sku to the list of loaded SKUs.
func (g *Gate) Register(ctx context.Context, sku string) error {
	return g.c.Do(ctx, g.c.B().Sadd().Key(g.registry()).Member(sku).Build()).Error()
}

// Ping checks that Redis answers: on a Redis Cluster, every primary serving
// slots (a keyless PING would reach one arbitrary node, and a SKU on a dead
// primary can sell nothing).
func (g *Gate) Ping(ctx context.Context) error {
	if g.c.Mode() != rueidis.ClientModeCluster {
		return g.c.Do(ctx, g.c.B().Ping().Build()).Error()
	}
	prim, err := g.primaries(ctx)
	if err != nil {
		return err
	}
	for _, p := range prim {
		if err := p.client.Do(ctx, p.client.B().Ping().Build()).Error(); err != nil {
			return fmt.Errorf("stockgate: primary %s: %w", p.addr, err)
		}
	}
	return nil
}

// Expire drops the keys of sku if its sale ended more than retention before
// now and nothing of it is in flight, and unregisters it. It reports whether
// the keys were dropped. A sale without an end is never dropped.
func (g *Gate) Expire(ctx context.Context, sku string, now time.Time, retention time.Duration) (bool, error) {
	k := g.KeysOf(sku)
	n, err := g.expire.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Res, k.Outbox, k.Idem, k.Rel, g.acceptedKey(sku), k.Closed},
		[]string{strconv.FormatInt(now.UnixMilli(), 10), strconv.FormatInt(retention.Milliseconds(), 10)}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("stockgate: expire: %w", err)
	}
	if n == 1 {
		for _, key := range []string{g.xferKey(sku), g.xinKey(sku)} {
			if err := g.c.Do(ctx, g.c.B().Del().Key(key).Build()).Error(); err != nil {
				return true, err
			}
		}
		if err := g.c.Do(ctx, g.c.B().Srem().Key(g.registry()).Member(sku).Build()).Error(); err != nil {
			return n == 1, err
		}
	}
	return n == 1, nil
}

// RunID returns the identity of the Redis data the sales were loaded into:
// it changes whenever a server may have lost writes. On a single server it
// is the run id (a restart). On a Redis Cluster it is, for every primary
// serving slots, "addr=run_id/master_replid", sorted by address: the run id
// changes when the primary restarts, the replication id when a replica is
// promoted in its place (a failover, forced or not: asynchronous replication
// may have left the last writes behind), and the list when a primary is
// added, removed or replaced. Replicas are left out, so their restarts and
// re-syncs change nothing. A primary that is marked failed, or does not
// answer, is an error: the cluster is not settled, ask again later.
func (g *Gate) RunID(ctx context.Context) (string, error) {
	if g.c.Mode() != rueidis.ClientModeCluster {
		return runID(ctx, g.c)
	}
	prim, err := g.primaries(ctx)
	if err != nil {
		return "", err
	}
	ids := make([]string, len(prim))
	for i, p := range prim {
		info, err := p.client.Do(ctx, p.client.B().Info().Section("server", "replication").Build()).ToString()
		if err != nil {
			return "", fmt.Errorf("stockgate: info on primary %s: %w", p.addr, err)
		}
		f := infoFields(info)
		if f["role"] != "master" {
			return "", fmt.Errorf("stockgate: primary %s answers role %q: the cluster is changing", p.addr, f["role"])
		}
		if f["run_id"] == "" || f["master_replid"] == "" {
			return "", fmt.Errorf("stockgate: primary %s: no run_id or master_replid in INFO", p.addr)
		}
		ids[i] = p.addr + "=" + f["run_id"] + "/" + f["master_replid"]
	}
	return strings.Join(ids, ","), nil
}

// primary is one primary of a Redis Cluster and the client of its node.
type primary struct {
	addr   string
	client rueidis.Client
}

// primaries returns the primaries serving slots, sorted by address, as the
// first node that answers CLUSTER NODES sees them: the client's own view
// (Nodes) may be stale after a failover.
func (g *Gate) primaries(ctx context.Context) ([]primary, error) {
	nodes := g.c.Nodes()
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	sort.Strings(addrs)
	var out string
	var err error
	for _, addr := range addrs {
		c := nodes[addr]
		if out, err = c.Do(ctx, c.B().ClusterNodes().Build()).ToString(); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("stockgate: cluster nodes: %w", err)
	}
	var prim []primary
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		// <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
		if len(f) < 9 || !strings.Contains(f[2], "master") {
			continue // a replica, or a primary with no slots (replaced)
		}
		addr, c, ok := nodeAddr(f[1], nodes)
		if strings.Contains(f[2], "fail") && !strings.Contains(f[2], "fail?") {
			return nil, fmt.Errorf("stockgate: primary %s is marked failed: the cluster is failing over", addr)
		}
		if !ok {
			return nil, fmt.Errorf("stockgate: primary %s is not known to the client yet", addr)
		}
		prim = append(prim, primary{addr: addr, client: c})
	}
	if len(prim) == 0 {
		return nil, errors.New("stockgate: CLUSTER NODES lists no primary with slots")
	}
	sort.Slice(prim, func(i, j int) bool { return prim[i].addr < prim[j].addr })
	return prim, nil
}

// nodeAddr finds the client of the node CLUSTER NODES names as
// "ip:port@cport[,hostname[,aux=value...]]": the client knows it by ip:port,
// or by hostname:port when the cluster announces hostnames
// (cluster-preferred-endpoint-type hostname).
func nodeAddr(field string, nodes map[string]rueidis.Client) (string, rueidis.Client, bool) {
	ipport, rest, _ := strings.Cut(field, "@")
	if c, ok := nodes[ipport]; ok {
		return ipport, c, true
	}
	if _, after, ok := strings.Cut(rest, ","); ok {
		host, _, _ := strings.Cut(after, ",")
		if _, port, err := net.SplitHostPort(ipport); err == nil && host != "" && !strings.Contains(host, "=") {
			hp := net.JoinHostPort(host, port)
			if c, ok := nodes[hp]; ok {
				return hp, c, true
			}
		}
	}
	return ipport, nil, false
}

// Primaries returns the address and a client of every Redis Cluster
// primary serving slots (the one server on a single Redis, named ""): for
// work that must reach every primary, such as a SCAN over every key.
func (g *Gate) Primaries(ctx context.Context) (map[string]rueidis.Client, error) {
	if g.c.Mode() != rueidis.ClientModeCluster {
		return map[string]rueidis.Client{"": g.c}, nil
	}
	prim, err := g.primaries(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]rueidis.Client, len(prim))
	for _, p := range prim {
		out[p.addr] = p.client
	}
	return out, nil
}

// infoFields parses INFO's "key:value" lines.
func infoFields(info string) map[string]string {
	f := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			f[k] = v
		}
	}
	return f
}

func runID(ctx context.Context, c rueidis.Client) (string, error) {
	info, err := c.Do(ctx, c.B().Info().Section("server").Build()).ToString()
	if err != nil {
		return "", fmt.Errorf("stockgate: info: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v, nil
		}
	}
	return "", errors.New("stockgate: no run_id in INFO server")
}

// SwapRunID records id as the run id the sales were last loaded for and
// returns the one recorded before ("" if none: a new or emptied Redis).
// Of several instances noticing the same restart, exactly one sees the old id.
func (g *Gate) SwapRunID(ctx context.Context, id string) (string, error) {
	prev, err := g.c.Do(ctx, g.c.B().Set().Key(g.prefix+":runid").Value(id).Get().Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	return prev, err
}

// Release is a released order (cancelled or expired) whose units and buyer
// slot the gate gives back.
type Release struct {
	OrderID  string
	User     string
	Quantity int64
	// IdempotencyKey is set on a direct sale's debit (Quantity < 0) whose
	// order carries a key: Restore records that the key made KeyOrderID.
	IdempotencyKey string
	KeyOrderID     string
}

// Restore gives released orders' units and buyer slots back, once per order
// id however often it is called. It returns the units given back now, or
// sale.ErrNotWarmed when the SKU is not loaded (a rebuild then counts the
// releases from the database; call again after it). A release with no order
// id or zero units fails the whole call with sale.ErrInvalid, nothing written.
func (g *Gate) Restore(ctx context.Context, sku string, rs []Release) (int64, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	for _, r := range rs {
		if r.OrderID == "" || r.Quantity == 0 {
			return 0, fmt.Errorf("%w: restore of order %q with %d units", sale.ErrInvalid, r.OrderID, r.Quantity)
		}
	}
	k, err := g.Buckets(ctx, sku)
	if err != nil {
		return 0, fmt.Errorf("stockgate: restore: %w", err)
	}
	if k > 1 {
		return g.restoreBuckets(ctx, sku, rs, k)
	}
	return g.restoreIn(ctx, sku, rs)
}

// restoreIn is Restore in one bucket.
func (g *Gate) restoreIn(ctx context.Context, sku string, rs []Release) (int64, error) {
	args := make([]string, 0, 3*len(rs))
	for _, r := range rs {
		if r.OrderID == "" || r.Quantity == 0 {
			return 0, fmt.Errorf("%w: restore of order %q with %d units", sale.ErrInvalid, r.OrderID, r.Quantity)
		}
		args = append(args, r.OrderID, r.User, strconv.FormatInt(r.Quantity, 10))
	}
	k := g.KeysOf(sku)
	vals, err := g.restore.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Rel}, args).AsIntSlice()
	if err != nil {
		return 0, fmt.Errorf("stockgate: restore: %w", err)
	}
	if vals[0] == -2 {
		return 0, sale.ErrNotWarmed
	}
	// A direct sale's key made its order: a retry through the gate of any
	// instance is answered with it. Idempotent, so done on every call (also
	// when the units were taken by an earlier one).
	var idem []string
	for _, r := range rs {
		if r.IdempotencyKey != "" && r.KeyOrderID != "" {
			idem = append(idem, r.User+"\x00"+r.IdempotencyKey, r.KeyOrderID)
		}
	}
	if len(idem) > 0 {
		cmd := g.c.B().Hset().Key(k.Idem).FieldValue()
		for i := 0; i < len(idem); i += 2 {
			cmd = cmd.FieldValue(idem[i], idem[i+1])
		}
		if err := g.c.Do(ctx, cmd.Build()).Error(); err != nil {
			return 0, fmt.Errorf("stockgate: restore: recording idempotency keys: %w", err)
		}
	}
	return vals[1], nil
}

// ClaimPrefix records owner as the deployment this Redis prefix belongs to
// (<prefix>:owner, set once: SET NX) and returns the owner recorded now:
// owner itself, or another deployment's that claimed it first. A prefix
// whose keys were lost (a Redis that restarted empty) is claimed again by
// the first instance to ask.
func (g *Gate) ClaimPrefix(ctx context.Context, owner string) (string, error) {
	prev, err := g.c.Do(ctx, g.c.B().Set().Key(g.prefix+":owner").Value(owner).Nx().Get().Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return owner, nil
	}
	if err != nil {
		return "", fmt.Errorf("stockgate: claim prefix: %w", err)
	}
	return prev, nil
}

// Prefix returns the prefix of the gate's keys.
func (g *Gate) Prefix() string { return g.prefix }

// TopologyRefresh is how often a Redis Cluster client made by ClientOption
// reads the cluster's shards again: a replica promoted by a failover is
// reachable through Nodes (and so checked by RunID and Ping) within it.
const TopologyRefresh = time.Second

// Dial connects to the Redis at url (see ClientOption) and checks that it
// is what the URL says: a URL naming several addresses must reach a Redis
// Cluster (rueidis falls back to one plain server when cluster support is
// disabled, which would leave the other addresses silently unused). Errors
// name the addresses tried.
func Dial(url string) (rueidis.Client, error) {
	opt, err := ClientOption(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	addrs := strings.Join(opt.InitAddress, ",")
	notCluster := fmt.Errorf("redis url names %d addresses (%s) but they are not a Redis Cluster: "+
		"name one server, or the nodes of a cluster", len(opt.InitAddress), addrs)
	c, err := rueidis.NewClient(opt)
	if err != nil {
		if len(opt.InitAddress) > 1 && strings.Contains(err.Error(), "cluster support disabled") {
			return nil, fmt.Errorf("%w (%w)", notCluster, err)
		}
		return nil, fmt.Errorf("redis %s: %w", addrs, err)
	}
	if len(opt.InitAddress) > 1 && c.Mode() != rueidis.ClientModeCluster {
		c.Close()
		return nil, notCluster
	}
	return c, nil
}

// ClientOption parses a Redis URL (rueidis form; redis://n1?addr=n2&addr=n3
// for a Redis Cluster) into the options the gate expects: no client-side
// caching, and on a cluster a topology refreshed every TopologyRefresh.
func ClientOption(url string) (rueidis.ClientOption, error) {
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		return opt, err
	}
	opt.DisableCache = true
	opt.ClusterOption.ShardsRefreshInterval = TopologyRefresh
	return opt, nil
}
