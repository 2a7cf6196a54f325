package stockgate

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"time"

	"github.com/redis/rueidis"
)

// Durable transfer halves. A transfer between two stock buckets writes to
// two primaries (the buckets' slots differ). Replication is asynchronous:
// a primary that fails over may lose its last writes, so a transfer whose
// first half is lost after the second one landed would duplicate its units
// (the donor's debit lost, the receiver's credit kept), and one whose
// credit is lost after the donor's entry was closed would lose them. Where
// the bucket's primary has replicas, each of the first two halves is sent
// with WAIT 1 <TransferWait> on the same connection (one DoMulti: rueidis
// sends a keyless command of a multi to the node of the multi's slot, and a
// multi holding a blocking command on one dedicated connection), and the
// next half is made only once a replica holds it:
//   - a debit no replica acknowledged is not credited now: the journal
//     entry is left to the sweeper (TransferAge later), which finds it only
//     if it survived;
//   - a credit no replica acknowledged leaves the entry open: the sweeper
//     credits again only if the credit (and its id in the receiver's xin
//     set) was lost, else it closes the entry.
// Until the sweeper closes such an entry its units are counted both in
// transfer and in the receiver (reads show that many more units for up to
// TransferAge plus a sweep). A script redirected (MOVED, ASK) while its
// slot migrates is retried on the new node without its WAIT, whose answer
// then says nothing of it: during a planned slot migration a half may be
// taken as durable that is not yet.

// DefaultTransferWait is how long a transfer half waits, by default, for a
// replica to acknowledge it (see SetTransferWait).
const DefaultTransferWait = 100 * time.Millisecond

// replicaCheck is how long a bucket primary's replica count (ROLE) is
// trusted before it is read again.
const replicaCheck = 10 * time.Second

// SetTransferWait sets how long each of the first two halves of a transfer
// between stock buckets waits for a replica of its primary (0: never
// waits). Call it before the gate is used.
func (g *Gate) SetTransferWait(d time.Duration) { g.xferWait = d }

type durableScript struct {
	lua        *rueidis.Lua
	body, sha1 string
}

// durable returns lua, whose source is body, as a script execDurable runs.
func durable(lua *rueidis.Lua, body string) durableScript {
	sum := sha1.Sum([]byte(body))
	return durableScript{lua: lua, body: body, sha1: hex.EncodeToString(sum[:])}
}

type replicaSeen struct {
	has bool
	at  time.Time
}

// replicated reports whether the primary of bucket name has a replica (its
// ROLE lists one), read at most every replicaCheck.
func (g *Gate) replicated(ctx context.Context, name string) bool {
	if g.xferWait <= 0 {
		return false
	}
	if v, ok := g.replicas.Load(name); ok && time.Since(v.(replicaSeen).at) < replicaCheck {
		return v.(replicaSeen).has
	}
	// A keyless ROLE in a multi with a key of the bucket goes to the
	// bucket's primary.
	rs := g.c.DoMulti(ctx, g.c.B().Exists().Key(g.KeysOf(name).Meta).Build(), g.c.B().Role().Build())
	has := false
	if arr, err := rs[1].ToArray(); err == nil && len(arr) >= 3 {
		if role, _ := arr[0].ToString(); role == "master" {
			reps, _ := arr[2].ToArray()
			has = len(reps) > 0
		}
	}
	g.replicas.Store(name, replicaSeen{has: has, at: time.Now()})
	return has
}

// execDurable runs s in bucket name and reports whether a replica
// acknowledged its writes within the transfer wait (true, too, where the
// primary has no replica: there is nothing a failover could lose to).
func (g *Gate) execDurable(ctx context.Context, name string, s durableScript, keys, args []string) (rueidis.RedisResult, bool) {
	if !g.replicated(ctx, name) {
		return s.lua.Exec(ctx, g.c, keys, args), true
	}
	wait := func() rueidis.Completed {
		return g.c.B().Wait().Numreplicas(1).Timeout(max(g.xferWait.Milliseconds(), 1)).Build()
	}
	n := int64(len(keys))
	rs := g.c.DoMulti(ctx, g.c.B().Evalsha().Sha1(s.sha1).Numkeys(n).Key(keys...).Arg(args...).Build(), wait())
	if e, ok := rueidis.IsRedisErr(rs[0].Error()); ok && e.IsNoScript() {
		rs = g.c.DoMulti(ctx, g.c.B().Eval().Script(s.body).Numkeys(n).Key(keys...).Arg(args...).Build(), wait())
	}
	acked, err := rs[1].AsInt64()
	if _, refused := rueidis.IsRedisErr(err); refused && rs[0].Error() == nil {
		// A Redis that refuses WAIT (a managed service that disables
		// it): go on as without replicas rather than stop every transfer
		// at its first half; asked again after replicaCheck.
		g.replicas.Store(name, replicaSeen{has: false, at: time.Now()})
		return rs[0], true
	}
	return rs[0], err == nil && acked >= 1
}
