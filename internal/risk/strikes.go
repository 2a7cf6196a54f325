package risk

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// Kinds of failure Strike counts.
const (
	StrikeProof  = "proof"  // a proof of work that does not verify
	StrikeReplay = "replay" // a ticket (or a solution) used again
)

// Config sets when Strikes lists a buyer automatically. cmd maps
// FLASHSALE_RISK_* variables to it (docs/configuration.md).
type Config struct {
	// ProofStrikes failed proofs of one buyer within Window list the buyer
	// (FLASHSALE_RISK_PROOF_STRIKES, default 20); 0: never.
	ProofStrikes int
	// ReplayStrikes spent solutions sent again by one buyer within Window list the
	// buyer (FLASHSALE_RISK_REPLAY_STRIKES, default 3); 0: never.
	ReplayStrikes int
	// Window is the fixed window failures are counted in, from a buyer's
	// first failure (FLASHSALE_RISK_WINDOW, default 10m).
	Window time.Duration
	// AutoTTL is how long an automatic entry blocks
	// (FLASHSALE_RISK_AUTO_TTL, default 15m).
	AutoTTL time.Duration
}

// DefaultConfig returns the defaults: 20 failed proofs or 3 spent solutions sent again
// in 10 minutes list a buyer for 15 minutes.
func DefaultConfig() Config {
	return Config{ProofStrikes: 20, ReplayStrikes: 3, Window: 10 * time.Minute, AutoTTL: 15 * time.Minute}
}

// Check reports a Config that cannot work.
func (c Config) Check() error {
	switch {
	case c.ProofStrikes < 0 || c.ReplayStrikes < 0:
		return errors.New("risk: strikes must be 0 (off) or more")
	case c.Window < time.Second || c.AutoTTL < time.Second:
		return errors.New("risk: window and auto TTL must be at least 1s")
	}
	return nil
}

// AutoActor is the actor of automatic entries in the audit trail.
const AutoActor = "flashsale"

//go:embed strike.lua
var strikeLua string

var strikeScript = rueidis.NewLuaScript(strikeLua)

// Strikes counts failures per buyer over all instances (Redis), and lists a
// buyer for Config.AutoTTL (an entry of source auto, actor "flashsale",
// audited like any other) when the failures of one kind within
// Config.Window reach its threshold. It is safe for concurrent use.
//
// Keys: <prefix>:risk:strikes:{risk:<user>}:<kind> (the counter, expiring
// with its window) and <prefix>:risk:auto:{risk:<user>} (set while the
// buyer's automatic entry is claimed, for AutoTTL). The hash tag is the
// buyer's, never a SKU's (SKU ids have no ':'): the crowd's failures spread
// over a Redis Cluster's slots instead of loading a hot sale's.
type Strikes struct {
	rdb     rueidis.Client
	prefix  string
	store   Store
	cfg     Config
	changed func()
	log     *slog.Logger
	now     func() time.Time
}

// NewStrikes returns Strikes counting in rdb under prefix, listing buyers
// in store and calling changed (Announcer.Changed) after each listing.
// Zero durations of cfg take their defaults.
func NewStrikes(rdb rueidis.Client, prefix string, store Store, cfg Config, changed func(), log *slog.Logger) (*Strikes, error) {
	def := DefaultConfig()
	if cfg.Window == 0 {
		cfg.Window = def.Window
	}
	if cfg.AutoTTL == 0 {
		cfg.AutoTTL = def.AutoTTL
	}
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if changed == nil {
		changed = func() {}
	}
	return &Strikes{rdb: rdb, prefix: prefix, store: store, cfg: cfg, changed: changed, log: log, now: time.Now}, nil
}

// Strike counts one failure of kind (StrikeProof or StrikeReplay) by user
// and reports whether the user is now over the threshold: listed by this
// call, or already (by another call, on any instance). The call that
// reaches the threshold lists the user; if that fails, it returns true
// with the error, and the next failure tries again. A kind whose threshold is 0
// counts nothing. An unknown kind or an invalid user id is an error
// wrapping sale.ErrInvalid; a Redis failure is returned as it is (the
// caller refuses the attempt it was judging anyway: a failure is a failure).
func (s *Strikes) Strike(ctx context.Context, user, kind string) (blocked bool, err error) {
	var threshold int
	var what string
	switch kind {
	case StrikeProof:
		threshold, what = s.cfg.ProofStrikes, "failed proofs"
	case StrikeReplay:
		threshold, what = s.cfg.ReplayStrikes, "spent solutions sent again"
	default:
		return false, fmt.Errorf("%w: strike kind %q", sale.ErrInvalid, kind)
	}
	if !sale.ValidUser(user) {
		return false, fmt.Errorf("%w: user %q", sale.ErrInvalid, user)
	}
	if threshold == 0 {
		return false, nil
	}
	tag := "{risk:" + user + "}"
	marker := s.prefix + ":risk:auto:" + tag
	r, err := strikeScript.Exec(ctx, s.rdb,
		[]string{s.prefix + ":risk:strikes:" + tag + ":" + kind, marker},
		[]string{ms(s.cfg.Window), strconv.Itoa(threshold), ms(s.cfg.AutoTTL)}).AsIntSlice()
	if err == nil && len(r) != 2 {
		err = fmt.Errorf("strike.lua answered %d values, want 2", len(r))
	}
	if err != nil {
		return false, fmt.Errorf("risk: strike %s: %w", kind, err)
	}
	if r[0] < int64(threshold) {
		return false, nil
	}
	if r[1] == 0 {
		return true, nil // listed already, by this instance or another
	}
	now := s.now()
	actx := orderstore.WithActor(ctx, orderstore.Actor{Name: AutoActor})
	e, err := s.store.AddRisk(actx, orderstore.RiskChange{Kind: orderstore.RiskBuyer, Value: user, Source: orderstore.RiskByAuto,
		Reason: fmt.Sprintf("auto: %d %s in %s", threshold, what, s.cfg.Window), ExpiresAt: now.Add(s.cfg.AutoTTL)}, now)
	if err != nil {
		// Give the claim back, so that the next failure lists the user.
		if derr := s.rdb.Do(context.WithoutCancel(ctx), s.rdb.B().Del().Key(marker).Build()).Error(); derr != nil {
			err = errors.Join(err, derr)
		}
		return true, fmt.Errorf("risk: listing %s automatically: %w", user, err)
	}
	s.log.InfoContext(ctx, "risk: buyer listed automatically", "entry", e.ID, "reason", e.Reason, "expires_at", e.ExpiresAt)
	s.changed()
	return true, nil
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
