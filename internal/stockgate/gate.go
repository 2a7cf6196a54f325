// Package stockgate is the Redis gate: one atomic Lua script per purchase
// checks the sale window, stock and per-user limit, takes the units, remembers
// the buyer and records the reservation in an outbox that cannot be lost.
//
// Keys of one SKU share the hash tag {sku_id}, so every script touches one
// Redis Cluster slot:
//
//	<prefix>:{sku}:meta    hash  avail, debt, limit, starts, ends, reserved, moves, epoch,
//	                             inflight (units in res), cfloor (closed markers dropped below), seeding,
//	                             layout (seed.lua), shadow, shadowlen, shadowseq (the journal's lease)
//	<prefix>:{sku}:buyers  hash  user -> units held
//	<prefix>:{sku}:res     hash  order_id -> reservation JSON (in flight)
//	<prefix>:{sku}:outbox  zset  order_id by accepted ms (not yet in the stream)
//	<prefix>:{sku}:idem    hash  user NUL Idempotency-Key -> order_id; '#' order_id -> 1 (closed)
//	<prefix>:{sku}:closed  zset  closed order ids by accepted ms (the '#' markers, dropped after ClosedRetention)
//	<prefix>:{sku}:rel     set   order ids whose release was restored here
//	<prefix>:{sku}:lock    string the token of the instance changing the SKU (LockSKU)
//	<prefix>:{sku}:journal stream the reserve script's decisions while a shadow holds a lease (shadow.go)
//	<prefix>:{sku}:shadows hash  the shadows' journal leases: token -> end ms (shadowlease.lua)
//	<prefix>:skus          set   SKUs loaded (scanned by the relay)
//
// Files by concern: gate.go (the Gate, its scripts and keys), reserve.go
// (the purchase path: Reserve, rate limits, Finalize), seed.go (loading
// and changing a sale: Seed, Fence, Resync, Adjust, Restore, Expire),
// lookup.go (reads: gauges, in flight, available, held, Lookup, outbox),
// identity.go (the connection: Dial, Ping, run ids, a cluster's
// primaries), owner.go (the prefix claim), buckets.go and durable.go
// (split sales and their transfers), rebuild.go (the rebuild-pending mark).
package stockgate

import (
	"context"
	_ "embed"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
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
	// leasewait.lua defines lease_wait, put in front of each script that
	// adds key fields to a sale outside reserve.lua (soldlease.lua).
	//go:embed leasewait.lua
	leaseWaitLua string
	//go:embed soldlease.lua
	soldLeaseLua string
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
	lease    durableScript // soldlease.lua
	keys     keyLookups    // Duplicate's coalesced look-ups (keylookup.go)
	xferWait time.Duration // see SetTransferWait
	replicas sync.Map      // bucket name -> replicaSeen (durable.go)
	// seedLease is the sold-out lease, ms, a load starts a sale with
	// (SetSeedLease; 0: none).
	seedLease atomic.Int64
}

// New returns a Gate on client c whose keys all start with prefix + ":".
// Scripts run by EVALSHA with a NOSCRIPT fallback (they survive a Redis restart).
// rueidis does not retry scripts, so an error never means "ran twice".
func New(c rueidis.Client, prefix string) *Gate {
	if c.Mode() == rueidis.ClientModeCluster {
		c = tryAgainClient{c} // a slot being moved: tryagain.go
	}
	return &Gate{
		c:        c,
		prefix:   prefix,
		closedMs: DefaultClosedRetention.Milliseconds(),
		reserve:  newReserveScript(reserveLua),
		finalize: rueidis.NewLuaScript(debtLua + finalizeLua),
		seed:     rueidis.NewLuaScript(leaseWaitLua + seedLua),
		inflight: rueidis.NewLuaScriptReadOnly(inflightLua),
		resync:   rueidis.NewLuaScript(resyncLua),
		adjust:   rueidis.NewLuaScript(debtLua + adjustLua),
		expire:   rueidis.NewLuaScript(expireLua),
		fence:    rueidis.NewLuaScript(fenceLua),
		restore:  rueidis.NewLuaScript(debtLua + leaseWaitLua + restoreLua),
		lease:    durable(rueidis.NewLuaScript(soldLeaseLua), soldLeaseLua),
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
type Keys struct{ Meta, Buyers, Res, Outbox, Idem, Rel, Lock, Closed, Journal string }

// KeysOf returns the keys of sku.
func (g *Gate) KeysOf(sku string) Keys {
	base := g.prefix + ":{" + sku + "}:"
	return Keys{Meta: base + "meta", Buyers: base + "buyers", Res: base + "res", Outbox: base + "outbox", Idem: base + "idem", Rel: base + "rel",
		Lock: base + "lock", Closed: base + "closed", Journal: base + "journal"}
}

func (g *Gate) registry() string { return g.prefix + ":skus" }

// SKUs returns the SKUs loaded in Redis (the relay's work list).
func (g *Gate) SKUs(ctx context.Context) ([]string, error) {
	return g.c.Do(ctx, g.c.B().Smembers().Key(g.registry()).Build()).AsStrSlice()
}

// Register adds sku to the list of loaded SKUs.
func (g *Gate) Register(ctx context.Context, sku string) error {
	return g.c.Do(ctx, g.c.B().Sadd().Key(g.registry()).Member(sku).Build()).Error()
}

// Prefix returns the prefix of the gate's keys.
func (g *Gate) Prefix() string { return g.prefix }
