package stockgate

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// Every request with an Idempotency-Key for a SKU this instance knows is
// sold out asks Redis whether the key already made an order (Duplicate): a
// retry must get its order back, and only Redis knows every instance's
// reservations. On a sold-out hot SKU that is every request, and one round
// trip each cost about as much as the rest of the request together. The
// look-ups of one SKU are therefore coalesced, group-commit style: the
// first one is sent at once, and the ones that arrive while it is in flight
// are sent together, as one HMGET, as soon as it returns. No timer: a
// look-up waits at most for the one in flight before it, and each is
// answered by a read made after it was asked, so it sees every
// reservation that was accepted before.

// keyBatchMax bounds the fields of one HMGET (several are sent in one
// round trip when more are waiting).
const keyBatchMax = 256

// keyBatchTimeout bounds one batch's round trip; each caller is bounded by
// its own context as well and stops waiting when that ends.
const keyBatchTimeout = 2 * time.Second

type keyLookups struct {
	mu sync.Mutex
	q  map[string]*keyQueue // by SKU
}

// keyQueue is one SKU's look-ups: waiting is what the next batch sends;
// busy is true while a batch of the SKU is in flight.
type keyQueue struct {
	waiting []*keyLookup
	busy    bool
}

type keyLookup struct {
	user, field string
	done        chan keyAnswer // buffered: the batch never blocks on a caller that gave up
}

type keyAnswer struct {
	id    string
	found bool
	err   error
}

var keyLookupPool = sync.Pool{New: func() any { return &keyLookup{done: make(chan keyAnswer, 1)} }}

// Duplicate returns the order that user's Idempotency-Key key already made
// on sku, if the gate holds it: no script, no limit counted. The purchase
// path asks it instead of the gate for a retry of a SKU it knows is sold
// out, so it is on the sold-out path of every request that carries a key:
// concurrent look-ups of one SKU share one round trip (see above), which
// reads the bucket count and bucket 0's keys together (both live under the
// SKU's own tag); a buyer whose home is another bucket of a split sale is
// read there in a second round trip. An error means Redis could not say,
// never "not found".
func (g *Gate) Duplicate(ctx context.Context, sku, user, key string) (string, bool, error) {
	// A context already done asks nothing: below, a batch that answers at
	// once and the done context would both be ready, and select picks
	// either (a look-up past its deadline answered "found" now and then).
	if err := ctx.Err(); err != nil {
		return "", false, fmt.Errorf("stockgate: idempotency lookup: %w", err)
	}
	l := keyLookupPool.Get().(*keyLookup)
	l.user, l.field = user, user+"\x00"+key
	g.keys.mu.Lock()
	if g.keys.q == nil {
		g.keys.q = make(map[string]*keyQueue)
	}
	q := g.keys.q[sku]
	if q == nil {
		q = &keyQueue{}
		g.keys.q[sku] = q
	}
	q.waiting = append(q.waiting, l)
	if !q.busy {
		q.busy = true
		go g.sendKeyBatches(sku, q)
	}
	g.keys.mu.Unlock()
	select {
	case a := <-l.done:
		keyLookupPool.Put(l)
		return a.id, a.found, a.err
	case <-ctx.Done():
		// The batch still answers into l.done; l is not reused.
		return "", false, fmt.Errorf("stockgate: idempotency lookup: %w", ctx.Err())
	}
}

// sendKeyBatches sends sku's waiting look-ups, batch after batch, until none
// is waiting.
func (g *Gate) sendKeyBatches(sku string, q *keyQueue) {
	var batch []*keyLookup
	for {
		g.keys.mu.Lock()
		batch, q.waiting = q.waiting, batch[:0]
		if len(batch) == 0 {
			q.busy = false
			if len(g.keys.q) > 1024 {
				// Many SKUs were asked about once: forget the idle ones.
				delete(g.keys.q, sku)
			}
			g.keys.mu.Unlock()
			return
		}
		g.keys.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), keyBatchTimeout)
		g.lookUpKeys(ctx, sku, batch)
		cancel()
		clear(batch)
	}
}

// lookUpKeys answers every look-up of batch: one round trip for an unsplit
// sale, a second one for the buyers of a split sale whose home bucket is not
// bucket 0 (one HMGET per home bucket).
func (g *Gate) lookUpKeys(ctx context.Context, sku string, batch []*keyLookup) {
	k0 := g.KeysOf(sku)
	cmds := make(rueidis.Commands, 0, 1+(len(batch)+keyBatchMax-1)/keyBatchMax)
	cmds = append(cmds, g.c.B().Hget().Key(k0.Meta).Field("buckets").Build())
	cmds = appendHmgets(g.c, cmds, k0.Idem, batch)
	rs := g.c.DoMulti(ctx, cmds...)
	k := 1
	switch v, err := rs[0].AsInt64(); {
	case err == nil:
		k = max(int(v), 1)
	case !rueidis.IsRedisNil(err):
		answerAll(batch, keyAnswer{err: fmt.Errorf("stockgate: buckets: %w", err)})
		return
	}
	away := map[string][]*keyLookup{}
	for i, a := range answersOf(batch, rs[1:]) {
		l := batch[i]
		if k > 1 {
			if home := HomeName(sku, l.user, k); home != sku {
				away[home] = append(away[home], l)
				continue
			}
		}
		l.done <- a
	}
	if len(away) == 0 {
		return
	}
	homes := make([]string, 0, len(away))
	cmds = cmds[:0]
	for home, ls := range away {
		homes = append(homes, home)
		cmds = appendHmgets(g.c, cmds, g.KeysOf(home).Idem, ls)
	}
	rs = g.c.DoMulti(ctx, cmds...)
	for _, home := range homes {
		ls := away[home]
		n := (len(ls) + keyBatchMax - 1) / keyBatchMax
		for j, a := range answersOf(ls, rs[:n]) {
			ls[j].done <- a
		}
		rs = rs[n:]
	}
}

// appendHmgets appends the HMGETs of the look-ups' fields in hash key,
// keyBatchMax fields each.
func appendHmgets(c rueidis.Client, cmds rueidis.Commands, key string, ls []*keyLookup) rueidis.Commands {
	for i := 0; i < len(ls); i += keyBatchMax {
		part := ls[i:min(i+keyBatchMax, len(ls))]
		fs := make([]string, len(part))
		for j, l := range part {
			fs[j] = l.field
		}
		cmds = append(cmds, c.B().Hmget().Key(key).Field(fs...).Build())
	}
	return cmds
}

// answersOf reads the replies of appendHmgets' commands: one answer per
// look-up of ls, in order.
func answersOf(ls []*keyLookup, rs []rueidis.RedisResult) []keyAnswer {
	as := make([]keyAnswer, len(ls))
	for i := 0; i < len(ls); i += keyBatchMax {
		part := as[i:min(i+keyBatchMax, len(ls))]
		vals, err := rs[i/keyBatchMax].ToArray()
		for j := range part {
			if err != nil {
				part[j] = keyAnswer{err: fmt.Errorf("stockgate: idempotency lookup: %w", err)}
			} else {
				part[j] = answerOf(&vals[j])
			}
		}
	}
	return as
}

func answerOf(r interface{ ToString() (string, error) }) keyAnswer {
	id, err := r.ToString()
	switch {
	case rueidis.IsRedisNil(err):
		return keyAnswer{}
	case err != nil:
		return keyAnswer{err: fmt.Errorf("stockgate: idempotency lookup: %w", err)}
	}
	return keyAnswer{id: id, found: true}
}

func answerAll(batch []*keyLookup, a keyAnswer) {
	for _, l := range batch {
		l.done <- a
	}
}
