package stockgate

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
)

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
	ks := []string{keys.Meta, keys.Buyers, keys.Res, keys.Outbox, keys.Idem, keys.Journal}
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
	case -9:
		return ReserveResult{}, ErrLayoutNewer
	}
	return ReserveResult{}, fmt.Errorf("stockgate: reserve: unexpected code %d", code)
}

// ErrLayoutNewer: the sale's keys were seeded in a layout newer than this
// release's scripts know (meta's layout field): a newer release's
// instances serve it. Nothing was written; the buyer is asked to retry.
var ErrLayoutNewer = fmt.Errorf("%w: the sale's redis keys are in a newer release's layout", sale.ErrUnavailable)

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
