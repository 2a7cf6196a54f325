package stockgate

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"golang.org/x/time/rate"
)

// Shadow decisions: a canary evaluates its own reserve script on the
// attempts the live path decides, and compares every decision.
//
// While a shadow holds the lease (meta's shadow field: a time in ms, renewed
// every Lease/3), the live reserve script of this release and later appends
// each decision it makes to the bucket's journal stream
// (<prefix>:{name}:journal, trimmed to about ShadowConfig.Journal entries),
// with the state the decision was made from: the units available, the
// per-user limit, the sale's window, the buyer's held units, and whether the
// order id or Idempotency-Key was already known. The journal is written in
// the script, so its order is the order Redis decided in, whichever instance
// asked.
//
// The shadow reads the journal and, for each entry in order, sets its own
// keys (<prefix>:{name}:shadow:<instance>:..., same slot) to that state and
// runs the candidate script on them with the same attempt: one script call
// per batch of entries. Setting the state from each entry, rather than
// keeping a long-lived copy, is what makes the comparison exact: a copy
// would drift on everything that is not a purchase attempt (releases given
// back, refusals compensated, restocks, transfers between buckets), and on
// attempts decided by an instance of a release that does not journal.
//
// A purchase never waits for the shadow: the live script's extra work is
// one HINCRBY, one HGET and one XADD, and only while a lease is held. The
// shadow compares at most Rate decisions a second; what it skips, and what
// the journal trimmed before it was read, is counted as dropped (the
// entries' sequence numbers say how many).
//
// Compared: the decision (accepted, duplicate, sold out, limit reached, sale
// not started, sale ended) and its value (units left after an acceptance,
// the order a duplicate points at, units available on sold out, units held
// on limit reached). Not journaled: rate limits (the candidate runs without
// them; they depend on Redis' clock), refusals about the call itself
// (bad arguments, SKU not loaded, stale bucket count).

var (
	//go:embed shadowrun.lua
	shadowRunLua string
	//go:embed shadowlease.lua
	shadowLeaseLua string
)

// ShadowConfig tunes a Shadow. Zero values take the defaults.
type ShadowConfig struct {
	// Instance names this shadow's keys; unique per process (required).
	Instance string
	// Script is the candidate reserve script; empty: this build's.
	Script string
	// Lease is how long the live path journals after the last renewal
	// (default 30 s; renewed every Lease/3).
	Lease time.Duration
	// Journal is the approximate length the journal is trimmed to (default 10,000).
	Journal int64
	// Rate is the most decisions compared per second per bucket (default 5,000).
	Rate float64
	// Batch is the most entries read and compared in one call (default 256).
	Batch int
	// Examples is how many mismatches are logged and kept (default 10).
	Examples int
	// Observe, if set, counts results: "match", "mismatch", "dropped".
	Observe func(result string, n int)
	Log     *slog.Logger
}

// ShadowMismatch is one decision the candidate made differently.
type ShadowMismatch struct {
	SKU      string `json:"sku_id"` // the bucket's name for a split sale
	OrderID  string `json:"order_id"`
	User     string `json:"user_id"`
	Quantity int64  `json:"quantity"`
	Live     string `json:"live"`
	Shadow   string `json:"shadow"`
}

// ShadowStats are a shadow's counts since it started.
type ShadowStats struct {
	Match    int64 `json:"match"`
	Mismatch int64 `json:"mismatch"`
	Dropped  int64 `json:"dropped"`
	// Same counts decisions made by a script identical to the candidate
	// (the canary's own purchases, or a stable group running the same
	// build): not compared, since a script agreeing with itself is no
	// evidence.
	Same     int64            `json:"same_script"`
	Examples []ShadowMismatch `json:"examples"`
}

// Shadow compares a candidate reserve script with the live path's decisions.
type Shadow struct {
	g      *Gate
	cfg    ShadowConfig
	run    *rueidis.Lua
	lease  *rueidis.Lua
	id     string       // the candidate's script id (ScriptID)
	runs   atomic.Int64 // numbers each Run's lease token
	mu     sync.Mutex
	stats  ShadowStats
	logged int
}

// ScriptID names a reserve script's source: the journal records the id of
// the script that made each decision. The gate puts
// "local SCRIPT_ID = '<id>'" in front of every reserve script it runs.
func ScriptID(src string) string {
	h := sha1.Sum([]byte(src))
	return hex.EncodeToString(h[:8])
}

// withScriptID is src as the gate runs it: its SCRIPT_ID defined first.
func withScriptID(src string) string {
	return "local SCRIPT_ID = '" + ScriptID(src) + "'\n" + src
}

// NewShadow returns a Shadow of g's sales; Run starts it on a bucket.
func (g *Gate) NewShadow(cfg ShadowConfig) *Shadow {
	if cfg.Script == "" {
		cfg.Script = reserveLua
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.Journal <= 0 {
		cfg.Journal = 10000
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 5000
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 256
	}
	if cfg.Examples <= 0 {
		cfg.Examples = 10
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Shadow{g: g, cfg: cfg, run: rueidis.NewLuaScript(candidateScript(cfg.Script)), lease: rueidis.NewLuaScript(shadowLeaseLua),
		id: ScriptID(cfg.Script)}
}

// candidateScript wraps a reserve script as a function called by
// shadowrun.lua for each journal entry.
func candidateScript(src string) string {
	return "local function candidate(KEYS, ARGV)\n" + withScriptID(src) + "\nend\n" + shadowRunLua
}

// Stats returns the counts so far.
func (s *Shadow) Stats() ShadowStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Examples = append([]ShadowMismatch(nil), s.stats.Examples...)
	return st
}

func (s *Shadow) count(result string, n int) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	switch result {
	case "match":
		s.stats.Match += int64(n)
	case "mismatch":
		s.stats.Mismatch += int64(n)
	case "dropped":
		s.stats.Dropped += int64(n)
	case "same":
		s.stats.Same += int64(n)
	}
	s.mu.Unlock()
	if s.cfg.Observe != nil {
		s.cfg.Observe(result, n)
	}
}

func (s *Shadow) shadowKeys(name string) []string {
	base := s.g.prefix + ":{" + name + "}:shadow:" + s.cfg.Instance + ":"
	return []string{base + "meta", base + "buyers", base + "res", base + "outbox", base + "idem", base + "journal"}
}

// shadowsKey is the hash of bucket name's journal leases (token -> end ms).
func (g *Gate) shadowsKey(name string) string { return g.prefix + ":{" + name + "}:shadows" }

// holdLease sets (on) or drops (off) the journal lease token holds on
// bucket name. Reports whether the bucket is loaded (on).
func (s *Shadow) holdLease(ctx context.Context, name, token string, on bool) (bool, error) {
	now := time.Now()
	until, mode := "0", "off"
	if on {
		until, mode = strconv.FormatInt(now.Add(s.cfg.Lease).UnixMilli(), 10), "on"
	}
	k := s.g.KeysOf(name)
	n, err := s.lease.Exec(ctx, s.g.c, []string{k.Meta, s.g.shadowsKey(name), k.Journal},
		[]string{mode, until, strconv.FormatInt(s.cfg.Journal, 10), token, strconv.FormatInt(now.UnixMilli(), 10)}).AsInt64()
	return n == 1, err
}

// journalEntry is one journaled decision (reserve.lua's journal fields).
type journalEntry struct {
	id  string
	seq int64
	f   map[string]string
}

// Run shadows bucket name (a SKU, or one bucket of a split sale) until ctx
// ends: it holds the journal lease, reads the decisions journaled from now
// on and compares each. On return the lease is dropped, so the live path
// stops journaling at once. Errors are logged and retried.
func (s *Shadow) Run(ctx context.Context, name string) {
	// A lease of its own: another shadow of the bucket (another instance,
	// or this one's next Run after a re-split) keeps journaling when this
	// one stops.
	token := s.cfg.Instance + ":" + strconv.FormatInt(s.runs.Add(1), 10)
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = s.holdLease(dctx, name, token, false)
	}()
	lim := rate.NewLimiter(rate.Limit(s.cfg.Rate), max(int(s.cfg.Rate), 1))
	journal := s.g.KeysOf(name).Journal
	last, lastSeq := "", int64(0)
	renewed := time.Time{}
	for ctx.Err() == nil {
		if last == "" {
			// Start after what is there (the entries of an earlier
			// shadow are not this one's to compare), read before the
			// lease is taken: every entry journaled under it is read.
			top, err := s.g.c.Do(ctx, s.g.c.B().Xrevrange().Key(journal).End("+").Start("-").Count(1).Build()).AsXRange()
			if err != nil {
				s.cfg.Log.Warn("shadow: journal", "sku_id", name, "err", err)
				waitCtx(ctx, time.Second)
				continue
			}
			last = "0-0"
			if len(top) > 0 {
				last = top[0].ID
			}
		}
		if time.Since(renewed) > s.cfg.Lease/3 {
			if _, err := s.holdLease(ctx, name, token, true); err != nil {
				s.cfg.Log.Warn("shadow: journal lease", "sku_id", name, "err", err)
				waitCtx(ctx, time.Second)
				continue
			}
			renewed = time.Now()
		}
		block := min(s.cfg.Lease/3, time.Second)
		res, err := s.g.c.Do(ctx, s.g.c.B().Xread().Count(int64(s.cfg.Batch)).Block(block.Milliseconds()).Streams().Key(journal).Id(last).Build()).AsXRead()
		if err != nil {
			if !rueidis.IsRedisNil(err) && ctx.Err() == nil {
				s.cfg.Log.Warn("shadow: journal", "sku_id", name, "err", err)
				waitCtx(ctx, time.Second)
			}
			continue
		}
		var batch []journalEntry
		for _, e := range res[journal] {
			last = e.ID
			seq, _ := strconv.ParseInt(e.FieldValues["n"], 10, 64)
			if lastSeq > 0 && seq > lastSeq+1 {
				s.count("dropped", int(seq-lastSeq-1)) // trimmed before it was read
			}
			lastSeq = seq
			if e.FieldValues["r"] == s.id {
				s.count("same", 1)
				continue
			}
			if !lim.Allow() {
				s.count("dropped", 1)
				continue
			}
			batch = append(batch, journalEntry{id: e.ID, seq: seq, f: e.FieldValues})
		}
		if len(batch) > 0 {
			if err := s.compare(ctx, name, batch); err != nil && ctx.Err() == nil {
				s.cfg.Log.Warn("shadow: compare", "sku_id", name, "err", err)
				s.count("dropped", len(batch))
			}
		}
	}
}

// shadowFields are the journal fields shadowrun.lua takes per entry, in order.
var shadowFields = []string{"o", "u", "q", "t", "k", "b", "a", "l", "s", "e", "h", "d", "x"}

// compare runs the candidate on batch and counts each decision.
func (s *Shadow) compare(ctx context.Context, name string, batch []journalEntry) error {
	args := make([]string, 0, len(batch)*len(shadowFields))
	for _, e := range batch {
		for _, f := range shadowFields {
			args = append(args, e.f[f])
		}
	}
	out, err := s.run.Exec(ctx, s.g.c, s.shadowKeys(name), args).ToArray()
	if err != nil {
		return err
	}
	if len(out) != len(batch) {
		return fmt.Errorf("shadow run: %d results for %d entries", len(out), len(batch))
	}
	match := 0
	for i, e := range batch {
		live := describeDecision(e.f["d"], e.f["x"])
		shadow, err := decisionOf(out[i])
		if err != nil {
			shadow = "error: " + err.Error()
		}
		if live == shadow {
			match++
			continue
		}
		s.count("mismatch", 1)
		q, _ := strconv.ParseInt(e.f["q"], 10, 64)
		m := ShadowMismatch{SKU: name, OrderID: e.f["o"], User: e.f["u"], Quantity: q, Live: live, Shadow: shadow}
		s.mu.Lock()
		example := s.logged < s.cfg.Examples
		if example {
			s.logged++
			s.stats.Examples = append(s.stats.Examples, m)
		}
		s.mu.Unlock()
		if example {
			s.cfg.Log.Warn("shadow decision differs", "sku_id", name, "order_id", m.OrderID, "user_id", m.User, "quantity", q, "live", live, "shadow", shadow)
		}
	}
	s.count("match", match)
	return nil
}

// describeDecision renders a reserve decision (code, value) in words, the
// same for the live journal and the candidate's reply.
func describeDecision(code, x string) string {
	switch code {
	case "1":
		return "accepted, " + x + " left"
	case "2":
		return "duplicate of " + x
	case "0":
		return "sold_out, " + x + " available"
	case "-1":
		return "limit_reached, " + x + " held"
	case "-3":
		return "sale_not_started"
	case "-4":
		return "sale_ended"
	}
	return "code " + code + " " + x
}

// decisionOf reads a reserve reply as describeDecision's words.
func decisionOf(m rueidis.RedisMessage) (string, error) {
	vals, err := m.ToArray()
	if err != nil {
		return "", err
	}
	if len(vals) == 0 {
		return "", errors.New("empty reply")
	}
	if tag, _ := vals[0].ToString(); tag == "error" {
		msg := ""
		if len(vals) > 1 {
			msg, _ = vals[1].ToString()
		}
		return "script error: " + msg, nil
	}
	code, err := vals[0].AsInt64()
	if err != nil {
		return "", err
	}
	str := func(i int) string {
		if i >= len(vals) {
			return ""
		}
		if v, err := vals[i].AsInt64(); err == nil {
			return strconv.FormatInt(v, 10)
		}
		v, _ := vals[i].ToString()
		return v
	}
	x := ""
	switch code {
	case 1:
		x = str(2)
	case 2, 0, -1:
		x = str(1)
	}
	return describeDecision(strconv.FormatInt(code, 10), x), nil
}

// RunSKUs shadows skus until ctx ends: every bucket of each (buckets
// returns a SKU's current number of stock buckets, 0 for a SKU without a
// sale), a Run per bucket, started and stopped as sales are created or
// re-split (checked every second).
func (s *Shadow) RunSKUs(ctx context.Context, skus []string, buckets func(sku string) int) {
	running := map[string]context.CancelFunc{}
	var wg sync.WaitGroup
	defer func() {
		for _, stop := range running {
			stop()
		}
		wg.Wait()
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		want := map[string]bool{}
		for _, sku := range skus {
			if k := buckets(sku); k > 0 {
				for _, name := range BucketNames(sku, k) {
					want[name] = true
				}
			}
		}
		for name, stop := range running {
			if !want[name] {
				stop()
				delete(running, name)
			}
		}
		for name := range want {
			if _, ok := running[name]; !ok {
				rctx, stop := context.WithCancel(ctx)
				running[name] = stop
				wg.Go(func() { s.Run(rctx, name) })
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// ReserveScript returns this build's reserve script: a shadow's default
// candidate, and the text a test alters to make a deliberately different one.
func ReserveScript() string { return reserveLua }

// JournalLeased reports whether a shadow holds the journal lease of
// bucket name: whether the live path journals its decisions now.
func (g *Gate) JournalLeased(ctx context.Context, name string) bool {
	v, err := g.c.Do(ctx, g.c.B().Hget().Key(g.KeysOf(name).Meta).Field("shadow").Build()).AsInt64()
	return err == nil && v > time.Now().UnixMilli()
}

// ReplaceReserveScript makes g's purchases run src instead of this build's
// reserve script. It exists for trials of a deliberately wrong gate in
// tests (a canary whose gate decides differently must be caught by the
// trial while the database guard keeps the invariants); serve never calls
// it. Call it before the gate takes purchases.
func (g *Gate) ReplaceReserveScript(src string) { g.reserve = newReserveScript(src) }

// newReserveScript is the gate's reserve script made of src.
func newReserveScript(src string) *rueidis.Lua { return rueidis.NewLuaScript(withScriptID(src)) }
