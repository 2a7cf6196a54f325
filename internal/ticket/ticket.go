// Package ticket hands out proof-of-work challenges for a sale and turns
// solved ones into tickets: short-lived tokens, signed, bound to the buyer,
// the SKU and the sale, that a purchase of a ticket sale must carry
// (docs/crowd.md).
//
// A challenge is an ALTCHA V2 challenge (internal/altcha) whose signed data
// names the buyer, the SKU and the sale's start, so a solution cannot be
// spliced onto another buyer or sale. Its work (the number of PBKDF2
// derivations a client expects to try) rises with the SKU's challenge rate
// and with the buyer's failed proofs (Level). A solved payload is claimed
// in a replay set before its one key derivation is spent, so each
// challenge issued costs the server at most one derivation, however often
// its payload is sent, and is redeemed at most once. The ticket itself is
// checked in memory (an HMAC), with no Redis call.
package ticket

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/flashsale/flashsale/internal/altcha"
	"github.com/flashsale/flashsale/internal/sale"
)

// Errors of Redeem and Check; each failure wraps exactly one.
var (
	// ErrMalformed: the payload is not a solved challenge at all.
	ErrMalformed = errors.New("ticket: malformed solution")
	// ErrForged: the challenge was not issued by flashsale (bad signature).
	ErrForged = errors.New("ticket: challenge not issued here")
	// ErrWrongSolution: an authentic challenge, not solved.
	ErrWrongSolution = errors.New("ticket: wrong solution")
	// ErrExpired: an authentic challenge past its expiry.
	ErrExpired = errors.New("ticket: challenge expired")
	// ErrOtherBuyer: a challenge issued to another buyer.
	ErrOtherBuyer = errors.New("ticket: challenge issued to another buyer")
	// ErrOtherSale: a challenge issued for another SKU, or for this SKU's
	// sale before it was rescheduled.
	ErrOtherSale = errors.New("ticket: challenge issued for another sale")
	// ErrReplayed: a challenge already redeemed (or tried) once.
	ErrReplayed = errors.New("ticket: challenge already used")
	// ErrNotOpen: challenges of this sale are not handed out yet.
	ErrNotOpen = errors.New("ticket: tickets not open yet")
	// ErrNotRequired: the sale needs no ticket.
	ErrNotRequired = errors.New("ticket: the sale needs no ticket")
	// ErrInvalidTicket: a purchase without a valid ticket (none, forged,
	// another buyer's or sale's, or expired). It is a sale.ErrTicketRequired.
	ErrInvalidTicket = fmt.Errorf("ticket: %w", sale.ErrTicketRequired)
	// ErrTicketExpired: an authentic ticket of this buyer and sale, out of
	// time. It is an ErrInvalidTicket.
	ErrTicketExpired = fmt.Errorf("%w (expired)", ErrInvalidTicket)
)

// Replays is the replay set, shared by every instance (Redis). Claim
// records a challenge's id for ttl and reports whether it was new; Settle
// records the ticket its redeem made; Settled returns that ticket ("" when
// the claim made none: a wrong solution, or a redeem still verifying).
type Replays interface {
	Claim(ctx context.Context, id string, ttl time.Duration) (bool, error)
	Settle(ctx context.Context, id, ticket string) error
	Settled(ctx context.Context, id string) (string, error)
}

// Config of a Service. Zero values take the defaults given.
type Config struct {
	// Key signs challenges and tickets; every instance has the same.
	// At least 16 bytes.
	Key []byte
	// ChallengeTTL is how long a challenge may be solved (default 5m).
	ChallengeTTL time.Duration
	// TicketTTL is how long a ticket is good after the later of its issue
	// and the sale's start (default 5m).
	TicketTTL time.Duration
	// Cost is the PBKDF2 iterations of one derivation (default 5000).
	Cost int
	// BaseWork is the most derivations a challenge at level 0 takes
	// (default 500: a mean of 250, about 0.3 s in a browser).
	BaseWork uint32
	// RateStep is the challenges per second of one SKU at this instance
	// that double the work (default 50): level = log2(1 + rate/RateStep)
	// rounded down, plus the buyer's recent failures.
	RateStep float64
	// MaxLevel caps the level (default 5: 32x the base work).
	MaxLevel int
	// FailureWindow is how long a failed proof raises the buyer's level
	// (default 10m).
	FailureWindow time.Duration
	// PerBuyer is the most challenges one buyer gets, and the most
	// solutions one buyer sends, a minute to this instance (default 10);
	// beyond it a *sale.RateLimitError.
	PerBuyer int
	// ChallengeLimit and VerifyLimit, if set, bound the challenges made
	// and the solutions verified per second by this instance (each one
	// PBKDF2 derivation). They are taken last, just before that work,
	// after every cheaper refusal: a flood of bogus requests spends
	// nobody's budget but its own buyer's.
	ChallengeLimit, VerifyLimit *rate.Limiter
	// OnFailure, if set, is told of each failed proof or replay (kind
	// "proof" or "replay"), e.g. to strike the buyer in the risk lists.
	OnFailure func(ctx context.Context, user, kind string)
}

func (c Config) withDefaults() Config {
	if c.ChallengeTTL <= 0 {
		c.ChallengeTTL = 5 * time.Minute
	}
	if c.TicketTTL <= 0 {
		c.TicketTTL = 5 * time.Minute
	}
	if c.Cost <= 0 {
		c.Cost = 5000
	}
	if c.BaseWork == 0 {
		c.BaseWork = 500
	}
	if c.RateStep <= 0 {
		c.RateStep = 50
	}
	if c.MaxLevel <= 0 {
		c.MaxLevel = 5
	}
	if c.PerBuyer <= 0 {
		c.PerBuyer = 10
	}
	if c.FailureWindow <= 0 {
		c.FailureWindow = 10 * time.Minute
	}
	return c
}

// Service issues challenges and tickets.
type Service struct {
	cfg     Config
	issuer  *altcha.Issuer
	mac     []byte
	replays Replays

	mu      sync.Mutex
	rates   map[string]*meter // SKU -> challenges issued here
	fails   generations       // buyer -> recent failed proofs
	issued  generations       // buyer -> challenges this minute
	redeems generations       // buyer -> solutions sent this minute
}

// New returns a Service signing with cfg.Key and claiming solutions in replays.
func New(cfg Config, replays Replays) (*Service, error) {
	cfg = cfg.withDefaults()
	if len(cfg.Key) < 16 {
		return nil, errors.New("ticket: key shorter than 16 bytes")
	}
	// Two keys from one: a challenge's signature never verifies as a ticket.
	iss, err := altcha.New(derive(cfg.Key, "flashsale/altcha"))
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, issuer: iss, mac: derive(cfg.Key, "flashsale/ticket"), replays: replays,
		rates: map[string]*meter{}}, nil
}

func derive(key []byte, label string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	return m.Sum(nil)
}

// Challenge is a challenge as the challenge route answers it.
type Challenge struct {
	// Body is the challenge in the altcha widget's format.
	Body json.RawMessage
	// Level is the difficulty level it was made at, Work its most derivations.
	Level int
	Work  uint32
	// Expires is when it stops being redeemable.
	Expires time.Time
}

// Challenge returns a new challenge of sku for user.
func (s *Service) Challenge(sku sale.SKU, user string, now time.Time) (Challenge, error) {
	if !sku.Crowd.TicketRequired {
		return Challenge{}, ErrNotRequired
	}
	if open := sku.TicketsOpen(); !open.IsZero() && now.Before(open) {
		return Challenge{}, fmt.Errorf("%w: they open at %s", ErrNotOpen, open.UTC().Format(time.RFC3339))
	}
	if wait, ok := s.allow(&s.issued, user, now); !ok {
		return Challenge{}, &sale.RateLimitError{Scope: "user", RetryAfter: wait}
	}
	if l := s.cfg.ChallengeLimit; l != nil && !l.AllowN(now, 1) {
		return Challenge{}, &sale.RateLimitError{Scope: "instance", RetryAfter: time.Second}
	}
	rate := s.count(sku.ID, now)
	level := s.Level(rate, s.failures(user, now))
	work := s.cfg.BaseWork << level
	exp := now.Add(s.cfg.ChallengeTTL)
	body, err := s.issuer.Create(altcha.Options{Cost: s.cfg.Cost, MaxNumber: work, Expires: exp,
		Params: map[string]string{"sku": sku.ID, "sub": user, "sale": saleID(sku)}})
	if err != nil {
		return Challenge{}, err
	}
	return Challenge{Body: body, Level: level, Work: work, Expires: exp.Truncate(time.Second)}, nil
}

// Level is the difficulty at a challenge rate (per second, this instance,
// this SKU) and a buyer's recent failed proofs: log2(1 + rate/RateStep)
// rounded down plus the failures, at most MaxLevel. Each level doubles the
// work.
func (s *Service) Level(rate float64, failures int) int {
	l := int(math.Log2(1+rate/s.cfg.RateStep)) + failures
	return min(max(l, 0), s.cfg.MaxLevel)
}

// saleID names the sale a challenge or ticket is for: its start, so a
// rescheduled sale refuses what was issued for the old one.
func saleID(sku sale.SKU) string {
	if sku.StartsAt.IsZero() {
		return "0"
	}
	return strconv.FormatInt(sku.StartsAt.UnixMilli(), 10)
}

// Ticket is a redeemed challenge.
type Ticket struct {
	Token string
	// Repeat: the challenge was redeemed before, by this buyer; this is
	// the ticket that redeem made (a retry whose answer was lost).
	Repeat bool
	// ValidFrom is the sale's start (a ticket is useless before it).
	ValidFrom time.Time
	Expires   time.Time
}

// Redeem verifies a solved payload for sku and user and returns a ticket.
// The order of its checks is the order of their cost: the buyer's own
// budget, the signature, expiry, buyer and sale (microseconds), the
// instance's verify budget, the claim in the replay set (one Redis call),
// and last the one key derivation. A challenge redeemed before by this
// buyer answers the ticket it made (Repeat), so a retry whose answer was
// lost is not a replay.
func (s *Service) Redeem(ctx context.Context, sku sale.SKU, user, payload string, now time.Time) (Ticket, error) {
	if !sku.Crowd.TicketRequired {
		return Ticket{}, ErrNotRequired
	}
	if wait, ok := s.allow(&s.redeems, user, now); !ok {
		return Ticket{}, &sale.RateLimitError{Scope: "user", RetryAfter: wait}
	}
	var claimErr error
	var prior string
	r, err := s.issuer.VerifyFunc(payload, now, func(r altcha.Result) error {
		switch {
		case r.Params["sub"] != user:
			return ErrOtherBuyer
		case r.Params["sku"] != sku.ID || r.Params["sale"] != saleID(sku):
			return ErrOtherSale
		}
		if l := s.cfg.VerifyLimit; l != nil && !l.AllowN(now, 1) {
			return &sale.RateLimitError{Scope: "instance", RetryAfter: time.Second}
		}
		// Kept a minute past the challenge's expiry, whatever the clocks of
		// this instance and Redis say (a relative TTL).
		fresh, err := s.replays.Claim(ctx, r.ID, r.Expires.Sub(now)+time.Minute)
		if err != nil {
			claimErr = err
			return err
		}
		if !fresh {
			if prior, err = s.replays.Settled(ctx, r.ID); err != nil {
				claimErr = err
				return err
			}
			return ErrReplayed
		}
		return nil
	})
	var rl *sale.RateLimitError
	switch {
	case err == nil:
	case claimErr != nil:
		return Ticket{}, fmt.Errorf("ticket: replay set: %w", claimErr)
	case errors.As(err, &rl):
		return Ticket{}, err
	case errors.Is(err, ErrOtherBuyer), errors.Is(err, ErrOtherSale):
		return Ticket{}, err
	case errors.Is(err, ErrReplayed):
		if prior != "" && s.Check(prior, sku, user, now) == nil {
			return s.ticketOf(prior, sku, true)
		}
		s.failed(ctx, user, "replay", now)
		return Ticket{}, err
	case errors.Is(err, altcha.ErrWrongSolution):
		s.failed(ctx, user, "proof", now)
		return Ticket{}, ErrWrongSolution
	case errors.Is(err, altcha.ErrBadSignature):
		s.failed(ctx, user, "proof", now)
		return Ticket{}, ErrForged
	case errors.Is(err, altcha.ErrExpired):
		return Ticket{}, ErrExpired
	default:
		return Ticket{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	exp := now
	if sku.StartsAt.After(exp) {
		exp = sku.StartsAt
	}
	exp = exp.Add(s.cfg.TicketTTL).Truncate(time.Millisecond)
	token := s.sign(sku.ID, user, saleID(sku), exp)
	// Best effort: without it a lost answer's retry is a replay (409).
	_ = s.replays.Settle(ctx, r.ID, token)
	return Ticket{Token: token, ValidFrom: sku.StartsAt, Expires: exp}, nil
}

// ticketOf describes a ticket token this Service signed.
func (s *Service) ticketOf(token string, sku sale.SKU, repeat bool) (Ticket, error) {
	exp, err := expiryOf(token)
	if err != nil {
		return Ticket{}, err
	}
	return Ticket{Token: token, Repeat: repeat, ValidFrom: sku.StartsAt, Expires: exp}, nil
}

// The ticket token: "t1." + base64url("sku:user:sale:expiresMs") + "." +
// base64url(the first 16 bytes of its HMAC-SHA256). SKU and buyer ids
// have no ':'.
const tokenVersion = "t1."

func (s *Service) sign(sku, user, saleID string, exp time.Time) string {
	body := base64.RawURLEncoding.EncodeToString([]byte(sku + ":" + user + ":" + saleID + ":" + strconv.FormatInt(exp.UnixMilli(), 10)))
	return tokenVersion + body + "." + s.tag(body)
}

func (s *Service) tag(body string) string {
	m := hmac.New(sha256.New, s.mac)
	m.Write([]byte(tokenVersion))
	m.Write([]byte(body))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

// Check reports whether token is a valid ticket of sku for user at now, in
// memory only. Every failure wraps ErrInvalidTicket and says why.
func (s *Service) Check(token string, sku sale.SKU, user string, now time.Time) error {
	if token == "" {
		return fmt.Errorf("%w: none given (get one: GET /api/v1/skus/%s/challenge, then POST .../ticket)", ErrInvalidTicket, sku.ID)
	}
	rest, ok := strings.CutPrefix(token, tokenVersion)
	body, tag, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || len(token) > 512 {
		return fmt.Errorf("%w: malformed", ErrInvalidTicket)
	}
	if !hmac.Equal([]byte(tag), []byte(s.tag(body))) {
		return fmt.Errorf("%w: not issued here", ErrInvalidTicket)
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return fmt.Errorf("%w: malformed", ErrInvalidTicket)
	}
	f := strings.Split(string(raw), ":")
	if len(f) != 4 {
		return fmt.Errorf("%w: malformed", ErrInvalidTicket)
	}
	exp, err := strconv.ParseInt(f[3], 10, 64)
	switch {
	case len(f[3]) > 16:
		return fmt.Errorf("%w: malformed", ErrInvalidTicket)
	case err != nil:
		return fmt.Errorf("%w: malformed", ErrInvalidTicket)
	case f[1] != user:
		return fmt.Errorf("%w: issued to another buyer", ErrInvalidTicket)
	case f[0] != sku.ID || f[2] != saleID(sku):
		return fmt.Errorf("%w: issued for another sale", ErrInvalidTicket)
	case now.UnixMilli() >= exp:
		return fmt.Errorf("%w at %s", ErrTicketExpired, time.UnixMilli(exp).UTC().Format(time.RFC3339))
	}
	return nil
}

// expiryOf reads the expiry of a well-formed token.
func expiryOf(token string) (time.Time, error) {
	rest, _ := strings.CutPrefix(token, tokenVersion)
	body, _, _ := strings.Cut(rest, ".")
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return time.Time{}, err
	}
	f := strings.Split(string(raw), ":")
	ms, err := strconv.ParseInt(f[len(f)-1], 10, 64)
	return time.UnixMilli(ms), err
}

// meter counts events per second: the rate is last second's count
// blended with this second's so far.
type meter struct {
	sec       int64
	cur, prev float64
}

func (m *meter) add(now time.Time) float64 {
	sec := now.Unix()
	switch d := sec - m.sec; {
	case d == 1:
		m.prev, m.cur = m.cur, 0
	case d > 1 || d < 0:
		m.prev, m.cur = 0, 0
	}
	m.sec = sec
	m.cur++
	frac := float64(now.Nanosecond()) / 1e9
	return m.cur + m.prev*(1-frac)
}

// count records a challenge of sku and returns the SKU's rate here.
func (s *Service) count(sku string, now time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.rates[sku]
	if m == nil {
		if len(s.rates) > 100_000 { // SKUs come from the catalog; a bound all the same
			clear(s.rates)
		}
		m = &meter{}
		s.rates[sku] = m
	}
	return m.add(now)
}

type failCount struct {
	n     int
	until time.Time
}

// maxEntries bounds each per-buyer map (a flood of ids costs memory, not
// more): past it the older generation is dropped, so the entries lost are
// those untouched longest, never the whole view at once.
const maxEntries = 200_000

// generations is a map in two generations: writes go to cur; when cur is
// full it becomes prev, and an entry read from prev moves back to cur.
type generations struct{ cur, prev map[string]failCount }

func (g *generations) get(k string) failCount {
	if f, ok := g.cur[k]; ok {
		return f
	}
	return g.prev[k]
}

func (g *generations) set(k string, f failCount) {
	if g.cur == nil {
		g.cur = map[string]failCount{}
	}
	if _, ok := g.cur[k]; !ok && len(g.cur) >= maxEntries/2 {
		g.prev, g.cur = g.cur, map[string]failCount{}
	}
	g.cur[k] = f
}

// allow counts an event of user in its minute in g and reports whether it
// is within PerBuyer, else how long until the minute ends.
func (s *Service) allow(g *generations, user string, now time.Time) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := g.get(user)
	if !now.Before(f.until) {
		f = failCount{until: now.Add(time.Minute)}
	}
	if f.n >= s.cfg.PerBuyer {
		return f.until.Sub(now), false
	}
	f.n++
	g.set(user, f)
	return 0, true
}

func (s *Service) failures(user string, now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fails.get(user)
	if now.After(f.until) {
		return 0
	}
	return f.n
}

func (s *Service) failed(ctx context.Context, user, kind string, now time.Time) {
	s.mu.Lock()
	f := s.fails.get(user)
	if now.After(f.until) {
		f.n = 0
	}
	f.n++
	f.until = now.Add(s.cfg.FailureWindow)
	s.fails.set(user, f)
	s.mu.Unlock()
	if s.cfg.OnFailure != nil {
		s.cfg.OnFailure(ctx, user, kind)
	}
}
