package stockgate

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/sale"
)

// Stock buckets. A SKU's keys share one hash tag, so one Redis core caps a
// hot SKU at any cluster size. A sale with buckets K > 1 is split into K
// "sub-SKUs" in Redis, each under its own hash tag (BucketName) with its own
// meta, buyers, res, outbox, accepted and idem keys, spread evenly over the
// 16384 slots. A buyer always buys from their home bucket (HomeBucket:
// FNV-1a of the user id mod K), which holds their buyer record, so the
// per-user limit stays exact. When the home bucket has too few units, units
// move to it from the others (xferout.lua, xferin.lua, xferdone.lua), and a
// buyer hears sold_out only when every bucket together has fewer than asked
// for (refill).

var (
	//go:embed xferout.lua
	xferOutLua string
	//go:embed xferin.lua
	xferInLua string
	//go:embed xferdone.lua
	xferDoneLua string
	//go:embed bucketread.lua
	bucketReadLua string

	xferOutScript    = durable(rueidis.NewLuaScript(xferOutLua), xferOutLua)
	xferInScript     = durable(rueidis.NewLuaScript(debtLua+xferInLua), debtLua+xferInLua)
	xferDoneScript   = rueidis.NewLuaScript(debtLua + xferDoneLua)
	bucketReadScript = rueidis.NewLuaScriptReadOnly(bucketReadLua)
)

// ErrBucketsChanged is returned when the sale was split into another number
// of stock buckets than the caller believes (its catalog is stale): nothing
// was written; reload the catalog and retry.
var ErrBucketsChanged = errors.New("stockgate: the sale's number of stock buckets changed")

// BucketSep separates a SKU id from the rest of a bucket name: it is not a
// SKU id character, so the SKU of a bucket name is unambiguous.
const BucketSep = "~"

// slotOf is the Redis Cluster slot of a key whose hash tag is tag
// (CRC16-CCITT/XMODEM mod 16384).
func slotOf(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// BucketName returns the name (the hash tag) of bucket b of k of sku: sku
// itself for bucket 0, so a sale with one bucket keeps its keys; for b > 0
// "<sku>~<n>" with n the first suffix whose slot is exactly
// slot(sku) + b*16384/k (mod 16384). Deterministic: every instance computes
// the same names, and the k tags sit at equal distances around the slot
// ring, so on a cluster whose primaries hold equal contiguous slot ranges
// (redis-cli --cluster create) k = primaries puts one bucket on each, and
// a multiple of them as many on each.
func BucketName(sku string, b, k int) string { return BucketNames(sku, k)[b] }

// bucketNames computes BucketNames: one pass over the suffixes until every
// target slot is hit (about 16384 * ln k tries).
func bucketNames(sku string, k int) []string {
	names := make([]string, k)
	names[0] = sku
	s0 := slotOf(sku)
	need := make(map[int]int, k-1)
	for b := 1; b < k; b++ {
		need[(s0+b*16384/k)%16384] = b
	}
	for n := 0; len(need) > 0 && n < 1<<24; n++ {
		name := sku + BucketSep + strconv.Itoa(n)
		if b, ok := need[slotOf(name)]; ok {
			names[b] = name
			delete(need, slotOf(name))
		}
	}
	for _, b := range need { // never seen: CRC16 reaches every slot long before
		names[b] = sku + BucketSep + "b" + strconv.Itoa(b)
	}
	return names
}

// SKUOf returns the SKU of a bucket name (the name itself for bucket 0).
func SKUOf(name string) string { return sale.SKUOfBucket(name) }

// HomeBucket returns the bucket of k that holds user's buyer record.
func HomeBucket(user string, k int) int {
	if k <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(user))
	return int(h.Sum32() % uint32(k))
}

var bucketCache sync.Map // sku NUL k -> []string

// BucketNames returns the names of the k buckets of sku, bucket 0 first.
func BucketNames(sku string, k int) []string {
	k = max(k, 1)
	key := sku + "\x00" + strconv.Itoa(k)
	if v, ok := bucketCache.Load(key); ok {
		return v.([]string)
	}
	names := []string{sku}
	if k > 1 {
		names = bucketNames(sku, k)
	}
	bucketCache.Store(key, names)
	return names
}

// HomeName returns the name of user's home bucket of sku split in k.
func HomeName(sku, user string, k int) string {
	if k <= 1 {
		return sku
	}
	return BucketNames(sku, k)[HomeBucket(user, k)]
}

// BucketOf returns the name of the bucket that holds r (its Bucket, or the SKU).
func BucketOf(r sale.Reservation) string {
	if r.Bucket != "" {
		return r.Bucket
	}
	return r.SKU
}

func (g *Gate) xferKey(name string) string { return g.prefix + ":{" + name + "}:xfer" }
func (g *Gate) xinKey(name string) string  { return g.prefix + ":{" + name + "}:xin" }

// Buckets returns the number of stock buckets sku is loaded with in Redis
// (the "buckets" field of bucket 0's meta; 1 when absent).
func (g *Gate) Buckets(ctx context.Context, sku string) (int, error) {
	v, err := g.c.Do(ctx, g.c.B().Hget().Key(g.KeysOf(sku).Meta).Field("buckets").Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("stockgate: buckets: %w", err)
	}
	return max(int(v), 1), nil
}

// SetBuckets records k in the meta hash of every named bucket (the reserve
// and transfer scripts refuse callers that believe another number). Called
// by a rebuild while the buckets are fenced, before they are seeded.
func (g *Gate) SetBuckets(ctx context.Context, names []string, k int) error {
	cmds := make(rueidis.Commands, 0, len(names))
	for _, n := range names {
		cmds = append(cmds, g.c.B().Hset().Key(g.KeysOf(n).Meta).FieldValue().FieldValue("buckets", strconv.Itoa(k)).Build())
	}
	for _, r := range g.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("stockgate: set buckets: %w", err)
		}
	}
	return nil
}

// ClearTransfers drops the transfer journals (xfer, xin) of the named
// buckets: a rebuild, with every bucket fenced, counts units in transfer
// from the database, so no entry of before may complete after it.
func (g *Gate) ClearTransfers(ctx context.Context, names []string) error {
	cmds := make(rueidis.Commands, 0, 2*len(names))
	for _, n := range names {
		cmds = append(cmds, g.c.B().Del().Key(g.xferKey(n)).Build(), g.c.B().Del().Key(g.xinKey(n)).Build())
	}
	for _, r := range g.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("stockgate: clear transfers: %w", err)
		}
	}
	return nil
}

// LockBuckets writes token into the change lock key of each named bucket
// (the caller holds the SKU's own lock): seed.lua, resync.lua and
// adjust.lua of a bucket check the lock under its own tag, so a holder
// whose SKU lock expired is fenced on every bucket too.
func (g *Gate) LockBuckets(ctx context.Context, names []string, token string, ttl time.Duration) error {
	cmds := make(rueidis.Commands, 0, len(names))
	for _, n := range names {
		cmds = append(cmds, g.c.B().Set().Key(g.KeysOf(n).Lock).Value(token).Px(ttl).Build())
	}
	for _, r := range g.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("stockgate: lock buckets: %w", err)
		}
	}
	return nil
}

// UnlockBuckets gives up the bucket locks LockBuckets took for token.
func (g *Gate) UnlockBuckets(ctx context.Context, names []string, token string) error {
	var first error
	for _, n := range names {
		if err := g.UnlockSKU(ctx, n, token); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// DropBuckets deletes every key of the named buckets and unregisters them:
// buckets a re-split no longer uses (nothing is in flight in them).
func (g *Gate) DropBuckets(ctx context.Context, names []string) error {
	for _, n := range names {
		k := g.KeysOf(n)
		for _, key := range []string{k.Meta, k.Buyers, k.Res, k.Outbox, k.Idem, k.Rel, g.acceptedKey(n), g.xferKey(n), g.xinKey(n), k.Journal, g.shadowsKey(n)} {
			if err := g.c.Do(ctx, g.c.B().Del().Key(key).Build()).Error(); err != nil {
				return fmt.Errorf("stockgate: drop bucket %s: %w", n, err)
			}
		}
		if err := g.c.Do(ctx, g.c.B().Srem().Key(g.registry()).Member(n).Build()).Error(); err != nil {
			return fmt.Errorf("stockgate: drop bucket %s: %w", n, err)
		}
	}
	return nil
}

// BucketState is one bucket's state (bucketread.lua).
type BucketState struct {
	Name                        string
	Loaded                      bool
	Avail, Debt, Reserved, Move int64
	Epoch                       string
	Buckets                     int
	// Transit is the units in transfer out of this bucket, not yet closed.
	Transit      int64
	Reservations []sale.Reservation
}

func (b BucketState) version() [4]int64 {
	l := int64(0)
	if b.Loaded {
		l = 1
	}
	return [4]int64{l, b.Reserved, b.Move, b.Transit}
}

// ReadBuckets reads the named buckets (each atomically, together not), with
// their in-flight reservations when withRes.
func (g *Gate) ReadBuckets(ctx context.Context, names []string, withRes bool) ([]BucketState, error) {
	flag := "0"
	if withRes {
		flag = "1"
	}
	cmds := make([]rueidis.LuaExec, len(names))
	for i, n := range names {
		k := g.KeysOf(n)
		cmds[i] = rueidis.LuaExec{Keys: []string{k.Meta, g.xferKey(n), k.Res}, Args: []string{flag}}
	}
	out := make([]BucketState, len(names))
	for i, r := range bucketReadScript.ExecMulti(ctx, g.c, cmds...) {
		vals, err := r.ToArray()
		if err != nil {
			return nil, fmt.Errorf("stockgate: read bucket %s: %w", names[i], err)
		}
		b := BucketState{Name: names[i]}
		l, _ := vals[0].AsInt64()
		b.Loaded = l == 1
		b.Avail, _ = vals[1].AsInt64()
		b.Debt, _ = vals[2].AsInt64()
		b.Reserved, _ = vals[3].AsInt64()
		b.Move, _ = vals[4].AsInt64()
		b.Epoch, _ = vals[5].ToString()
		ks, _ := vals[6].ToString()
		b.Buckets, _ = strconv.Atoi(ks)
		b.Transit, _ = vals[7].AsInt64()
		kv, _ := vals[8].AsStrSlice()
		for j := 0; j+1 < len(kv); j += 2 {
			var res sale.Reservation
			if err := json.Unmarshal([]byte(kv[j+1]), &res); err != nil {
				return nil, fmt.Errorf("stockgate: in-flight entry %s: %w", kv[j], err)
			}
			b.Reservations = append(b.Reservations, res)
		}
		out[i] = b
	}
	return out, nil
}

// readInFlightBuckets is ReadInFlight of a sale split in k > 1 buckets:
// the sum over its buckets (each read atomically, the sum not: a refusal,
// a release or a transfer between two reads moves Moves, so callers that
// compare two reads see it). Units in transfer count as available.
func (g *Gate) readInFlightBuckets(ctx context.Context, sku string, k int) (InFlight, error) {
	bs, err := g.ReadBuckets(ctx, BucketNames(sku, k), true)
	if err != nil {
		return InFlight{}, err
	}
	f := InFlight{Loaded: true}
	epochs := make([]string, len(bs))
	for i, b := range bs {
		f.Loaded = f.Loaded && b.Loaded
		f.Reserved += b.Reserved
		f.Available += b.Avail - b.Debt + b.Transit
		f.Debt += b.Debt
		f.Moves += b.Move
		epochs[i] = b.Epoch
		f.Reservations = append(f.Reservations, b.Reservations...)
	}
	f.Epoch = strings.Join(epochs, ",")
	return f, nil
}

// maxRefills bounds the transfers one purchase makes before it gives up
// with sale.ErrBusy (units keep moving under it: the last few units of a
// very busy sale).
const maxRefills = 32

// maxSpins bounds the reads of every bucket one refill makes (waiting for
// transfers in progress, or for two reads in a row to agree).
const maxSpins = 60

// A refill whose read changed nothing (reads that disagree, units held
// only by transfers in progress) waits before it reads every bucket again,
// from refillWaitMin doubling to refillWaitMax: maxSpins reads take about
// a second before the purchase gives up (sale.ErrBusy), instead of K reads a
// millisecond or less for as long.
const (
	refillWaitMin = 250 * time.Microsecond
	refillWaitMax = 16 * time.Millisecond
)

// reserveBuckets is ReserveLimited of a sale split in k > 1 buckets: the
// reservation is made in the buyer's home bucket; when it has too few
// units, units move to it from the others and it tries again. The rate
// limits are counted once, on the first attempt.
func (g *Gate) reserveBuckets(ctx context.Context, r sale.Reservation, l Limits, k int) (ReserveResult, error) {
	names := BucketNames(r.SKU, k)
	home := HomeBucket(r.User, k)
	// Rate limit keys live in the bucket's slot: the SKU's and the IP's
	// budgets are shared out over the buckets (buyers spread evenly over
	// them); the user's is whole (a user buys from one bucket).
	l.SKU, l.IP = l.SKU.share(k), l.IP.share(k)
	for round := 0; ; round++ {
		res, err := g.reserveIn(ctx, r, l, k)
		if errors.Is(err, sale.ErrNotWarmed) {
			// The home bucket of a stale split may not exist at all.
			if g.splitOtherwise(ctx, r.SKU, k) {
				return ReserveResult{}, ErrBucketsChanged
			}
		}
		var so *SoldOutError
		if !errors.As(err, &so) {
			if err == nil && res.Available == 0 {
				res.Available = -1 // the home bucket is empty, the sale may not be
			}
			return res, err
		}
		l = Limits{}
		total, err := g.refill(ctx, names, home, r.Quantity, k)
		if err != nil {
			return ReserveResult{}, err
		}
		if total >= 0 {
			return ReserveResult{}, &SoldOutError{Available: total}
		}
		if round == maxRefills {
			return ReserveResult{}, fmt.Errorf("%w: stock buckets of %s kept moving", sale.ErrBusy, r.SKU)
		}
	}
}

// refill makes the home bucket hold want units if the buckets together
// have them. It returns -1 when the caller should try its reservation
// again (the home bucket may now have them), or the units the sale has in
// all (fewer than want: sold out). "Sold out" is decided on a consistent
// view: two reads of every bucket in a row, between which no bucket moved
// (double collect), show fewer than want units in all, none in transfer.
func (g *Gate) refill(ctx context.Context, names []string, home int, want int64, k int) (int64, error) {
	var prev []BucketState
	wait := refillWaitMin
	backoff := func() error {
		t := time.NewTimer(wait)
		defer t.Stop()
		wait = min(2*wait, refillWaitMax)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	swept := false
	for spin := 0; ; spin++ {
		if spin > maxSpins {
			// Never a sold_out the buckets did not show at one instant.
			return 0, fmt.Errorf("%w: stock buckets of %s kept moving", sale.ErrBusy, names[0])
		}
		bs, err := g.ReadBuckets(ctx, names, false)
		if err != nil {
			return 0, err
		}
		var total, transit int64
		for _, b := range bs {
			if !b.Loaded {
				return 0, sale.ErrNotWarmed
			}
			if b.Buckets != k {
				return 0, ErrBucketsChanged
			}
			total += max(b.Avail, 0)
			transit += b.Transit
		}
		h := bs[home]
		if h.Avail >= want {
			return -1, nil
		}
		if total+transit < want {
			if prev != nil && same(prev, bs) {
				return total, nil
			}
			if prev != nil { // two reads that disagree: let the buckets settle
				if err := backoff(); err != nil {
					return 0, err
				}
			}
			prev = bs
			continue
		}
		prev = nil
		// Largest donor first.
		d := -1
		for i, b := range bs {
			if i != home && b.Avail > 0 && (d < 0 || b.Avail > bs[d].Avail) {
				d = i
			}
		}
		if d < 0 {
			// Only transfers in progress hold units: they land shortly.
			// One whose caller died (TransferAge old) is finished here
			// rather than when the sweeper next looks at the sale.
			if !swept {
				swept = true
				n := 0
				for _, b := range bs {
					if b.Transit > 0 {
						done, err := g.SweepTransfers(ctx, b.Name, time.Now().Add(-TransferAge))
						if err != nil {
							return 0, err
						}
						n += done
					}
				}
				if n > 0 {
					continue
				}
			}
			if err := backoff(); err != nil {
				return 0, err
			}
			continue
		}
		units := max(want-h.Avail, (bs[d].Avail+1)/2)
		if err := g.transfer(ctx, names[d], names[home], h.Epoch, units, k); err != nil {
			return 0, err
		}
		return -1, nil
	}
}

// share returns the part of rate r one of k buckets enforces.
func (r Rate) share(k int) Rate {
	if !r.On() || k <= 1 {
		return r
	}
	return Rate{PerSecond: r.PerSecond / float64(k), Burst: (max(r.Burst, 1) + k - 1) / k}
}

func same(a, b []BucketState) bool {
	for i := range a {
		if a[i].version() != b[i].version() || a[i].Avail != b[i].Avail || a[i].Epoch != b[i].Epoch {
			return false
		}
	}
	return true
}

func newTransferID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// transfer moves up to units from bucket from to bucket to (whose epoch
// the caller read): debit and journal entry in from, credit in to (once per
// id), entry closed. A failure after the debit leaves the entry for
// SweepTransfers.
func (g *Gate) transfer(ctx context.Context, from, to, toEpoch string, units int64, k int) error {
	id := newTransferID()
	r, durable := g.execDurable(ctx, from, xferOutScript, []string{g.KeysOf(from).Meta, g.xferKey(from)},
		[]string{id, to, toEpoch, strconv.FormatInt(units, 10), strconv.Itoa(k), strconv.FormatInt(time.Now().UnixMilli(), 10)})
	vals, err := r.AsIntSlice()
	if err != nil {
		return fmt.Errorf("stockgate: transfer out: %w", err)
	}
	switch vals[0] {
	case -2:
		return sale.ErrNotWarmed
	case -7:
		return ErrBucketsChanged
	case 0:
		return nil
	}
	if !durable {
		// No replica holds the debit yet: crediting now would duplicate
		// the units if the donor's primary failed over without it. The
		// sweeper finishes the entry, if it survived (durable.go); the
		// purchase stops moving units for now (its replicas lag).
		return fmt.Errorf("%w: a replica of stock bucket %s did not acknowledge a transfer within %v", sale.ErrBusy, from, g.xferWait)
	}
	if afterTransferOut != nil {
		afterTransferOut()
	}
	return g.completeTransfer(ctx, from, id, to, toEpoch, vals[0])
}

// afterTransferOut, if set (tests), is called between a transfer's first
// and second halves.
var afterTransferOut func()

// completeTransfer credits to with the transfer id of from, then closes
// the entry (or refunds it when to can never be credited).
func (g *Gate) completeTransfer(ctx context.Context, from, id, to, toEpoch string, units int64) error {
	r, durable := g.execDurable(ctx, to, xferInScript, []string{g.KeysOf(to).Meta, g.xinKey(to)},
		[]string{id, strconv.FormatInt(units, 10), toEpoch})
	n, err := r.AsInt64()
	if err != nil {
		return fmt.Errorf("stockgate: transfer in: %w", err)
	}
	mode := "done"
	switch n {
	case -2:
		return nil // receiver fenced: its rebuild clears the entry, or the sweeper finishes it
	case -3:
		mode = "refund"
	case 1:
		if !durable {
			// The entry stays open until a replica may hold the credit:
			// the sweeper credits again only if it was lost (durable.go).
			return nil
		}
	}
	if err := xferDoneScript.Exec(ctx, g.c, []string{g.KeysOf(from).Meta, g.xferKey(from)}, []string{id, mode}).Error(); err != nil {
		return fmt.Errorf("stockgate: transfer done: %w", err)
	}
	return nil
}

// SweepTransfers finishes the transfers out of bucket name recorded before
// before (their caller died or lost Redis between the halves): each is
// credited (once: the receiver's xin set) and closed, or refunded when its
// receiver was loaded again since. It returns how many it finished.
func (g *Gate) SweepTransfers(ctx context.Context, name string, before time.Time) (int, error) {
	m, err := g.c.Do(ctx, g.c.B().Hgetall().Key(g.xferKey(name)).Build()).AsStrMap()
	if err != nil {
		return 0, fmt.Errorf("stockgate: sweep transfers: %w", err)
	}
	n := 0
	for id, v := range m {
		var e struct {
			To    string `json:"to"`
			Epoch string `json:"epoch"`
			Units int64  `json:"units"`
			At    int64  `json:"at"`
		}
		if err := json.Unmarshal([]byte(v), &e); err != nil || e.At > before.UnixMilli() {
			continue
		}
		if err := g.completeTransfer(ctx, name, id, e.To, e.Epoch, e.Units); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// restoreBuckets is Restore of a sale split in k > 1 buckets: each release
// goes to its buyer's home bucket (which holds the buyer record), a stock
// change made outside flashsale (no user) to bucket 0.
func (g *Gate) restoreBuckets(ctx context.Context, sku string, rs []Release, k int) (int64, error) {
	by := map[string][]Release{}
	for _, r := range rs {
		n := sku
		if r.User != "" {
			n = HomeName(sku, r.User, k)
		}
		by[n] = append(by[n], r)
	}
	var units int64
	for n, list := range by {
		u, err := g.restoreIn(ctx, n, list)
		if err != nil {
			return units, err
		}
		units += u
	}
	// Best effort, as after a refusal (see Finalize).
	_, _ = g.SettleDebt(ctx, sku)
	return units, nil
}

// SeedSplit loads a sale split in k stock buckets that Redis does not
// hold (every bucket new or fenced; the caller holds the SKU's change lock
// cfg.Lock and, for k > 1, the buckets' locks, LockBuckets). available is
// the sale's units net of those in flight (database stock - units in
// flight; negative: debt), split evenly over the buckets; a debt is split
// over the buckets in proportion to the units in flight there (their
// refusals pay it). Each buyer's holding goes to their home bucket, each
// reservation in flight to its own bucket (BucketOf), each Idempotency-Key
// to its user's home bucket, and every released order id to every bucket
// (a late restore of it, to whichever bucket, does nothing). Transfer
// journals are cleared and k is recorded in every bucket before it is
// seeded. For k = 1 it is Seed, with the number of buckets recorded.
// It returns false when a bucket was already loaded (that bucket unchanged).
func (g *Gate) SeedSplit(ctx context.Context, sku string, cfg Config, k int, available int64, holdings map[string]int64, inflight []sale.Reservation, released []Release, idem map[string]string, epoch string) (bool, error) {
	k = max(k, 1)
	names := BucketNames(sku, k)
	if err := g.SetBuckets(ctx, names, k); err != nil {
		return false, err
	}
	if err := g.ClearTransfers(ctx, names); err != nil {
		return false, err
	}
	if k == 1 {
		return g.Seed(ctx, sku, cfg, available, holdings, inflight, released, idem, epoch)
	}
	index := make(map[string]int, k)
	for b, n := range names {
		index[n] = b
	}
	hold := make([]map[string]int64, k)
	keys := make([]map[string]string, k)
	fly := make([][]sale.Reservation, k)
	units := make([]int64, k)
	for b := range k {
		hold[b], keys[b] = map[string]int64{}, map[string]string{}
	}
	for u, n := range holdings {
		hold[HomeBucket(u, k)][u] = n
	}
	for key, id := range idem {
		u, _, _ := strings.Cut(key, "\x00")
		keys[HomeBucket(u, k)][key] = id
	}
	for _, r := range inflight {
		b, ok := index[BucketOf(r)]
		if !ok {
			b = HomeBucket(r.User, k)
		}
		fly[b] = append(fly[b], r)
		units[b] += r.Quantity
	}
	avail := make([]int64, k)
	if available >= 0 {
		for b := range k {
			avail[b] = available / int64(k)
			if int64(b) < available%int64(k) {
				avail[b]++
			}
		}
	} else {
		debt := -available
		for b := range k {
			d := min(units[b], debt)
			avail[b], debt = -d, debt-d
		}
		avail[0] -= debt
	}
	all := true
	for b, n := range names {
		// No sold-out lease: a split sale is never leased (a re-split
		// of a leased sale waited for its lease in bucket 0's load).
		ok, err := g.seedLeased(ctx, n, cfg, avail[b], hold[b], fly[b], released, keys[b], epoch+"-"+strconv.Itoa(b), 0)
		if err != nil {
			return false, fmt.Errorf("bucket %s: %w", n, err)
		}
		all = all && ok
	}
	return all, nil
}

// SettleDebt moves units from buckets of a split sale that have them
// available to buckets that owe units (debt): a debt is paid by refusals in
// its own bucket, but the refusals of a split sale may give units back in
// another, which would then sell units the database no longer has (the
// database refuses those too: never oversold, but admitted in vain). The
// transfer's credit pays the debt first (xferin.lua). Called after a
// refusal or an outside decrement lands, and every second by the sweeper.
// It returns the units moved.
func (g *Gate) SettleDebt(ctx context.Context, sku string) (int64, error) {
	k, err := g.Buckets(ctx, sku)
	if err != nil || k <= 1 {
		return 0, err
	}
	names := BucketNames(sku, k)
	bs, err := g.ReadBuckets(ctx, names, false)
	if err != nil {
		return 0, err
	}
	var moved int64
	for i := range bs {
		for bs[i].Debt > 0 && bs[i].Loaded {
			d := -1
			for j, b := range bs {
				if j != i && b.Loaded && b.Avail > 0 && (d < 0 || b.Avail > bs[d].Avail) {
					d = j
				}
			}
			if d < 0 {
				return moved, nil
			}
			n := min(bs[i].Debt, bs[d].Avail)
			if err := g.transfer(ctx, names[d], names[i], bs[i].Epoch, n, k); err != nil {
				return moved, err
			}
			bs[i].Debt -= n
			bs[d].Avail -= n
			moved += n
		}
	}
	return moved, nil
}

// settleAfter runs SettleDebt for the sale of bucket name when it is split
// (its meta names more than one bucket).
func (g *Gate) settleAfter(ctx context.Context, name string) error {
	v, err := g.c.Do(ctx, g.c.B().Hget().Key(g.KeysOf(name).Meta).Field("buckets").Build()).AsInt64()
	if rueidis.IsRedisNil(err) || err == nil && v <= 1 {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = g.SettleDebt(ctx, SKUOf(name))
	return err
}

// splitOtherwise reports whether Redis holds sku (bucket 0) split in
// another number of buckets than k: recorded so, or loaded without a
// number (1).
func (g *Gate) splitOtherwise(ctx context.Context, sku string, k int) bool {
	m, err := g.c.Do(ctx, g.c.B().Hmget().Key(g.KeysOf(sku).Meta).Field("buckets", "epoch").Build()).ToArray()
	if err != nil {
		return false
	}
	if n, err := m[0].AsInt64(); err == nil {
		return int(n) != k
	}
	_, err = m[1].ToString()
	return err == nil && k != 1
}
