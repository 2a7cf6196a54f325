// Package salehistory counts every sale second by second across all
// instances and records, when a sale ends, one sale_history row: peak
// attempts and acceptances per second, time to sell out, buyers, units,
// refusals by reason, p99, the largest backlog, and the crowd's figures
// (docs/capacity.md, "Sale history").
//
// Each instance counts its purchases in memory (Tally.Record: a mutex per
// SKU, no I/O) and adds the counts of every finished second to Redis once a
// second, one pipeline per active SKU (Tally.Flush). Every instance adds
// into the same hash per SKU and second, so the sums are exact across the
// fleet. Keys (new in this release; an older release neither reads nor
// writes them), all of one SKU under one hash tag:
//
//	<prefix>:{hist:<sku>}:<unix second>  hash   attempts, accepted, one field per refusal outcome,
//	                                             lat:<i> latency bucket counts, backlog and queue (maxima)
//	<prefix>:{hist:<sku>}:secs           zset   the seconds that have a hash (score = member = second)
//
// Both expire Retention after their last write.
package salehistory

import (
	"context"
	_ "embed"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// Retention is how long the per-second counts stay in Redis after their
// last write: long enough to record a sale (or re-record it on demand) well
// after it ended.
const Retention = 6 * time.Hour

// Latency buckets: bucket i counts latencies up to bucketBound(i), a
// factor of 2^(1/4) apart from 50 µs: 64 buckets reach ~2 minutes. p99 is
// read as the upper bound of the bucket holding the 99th percentile: at
// most 19% high, never low.
const (
	latField   = "lat:" // + bucket index
	latBuckets = 64
	latBase    = 50 * time.Microsecond
)

func bucketBound(i int) time.Duration {
	return time.Duration(float64(latBase) * math.Pow(2, float64(i)/4))
}

func bucketOf(d time.Duration) int {
	if d <= latBase {
		return 0
	}
	i := int(math.Ceil(4 * math.Log2(float64(d)/float64(latBase))))
	return min(i, latBuckets-1)
}

// counts are one SKU's counts of one second.
type counts struct {
	outcomes map[string]int64
	lat      [latBuckets]int64
}

type skuTally struct {
	mu   sync.Mutex
	secs map[int64]*counts
	last int64 // the last second counted
}

// Tally is one instance's in-memory count of purchases per SKU and second.
// Record is safe for concurrent use and does no I/O; Flush adds the
// finished seconds to Redis.
type Tally struct {
	c      rueidis.Client
	prefix string
	now    func() time.Time
	skus   sync.Map // sku -> *skuTally
}

// NewTally returns a tally that flushes to c under prefix.
func NewTally(c rueidis.Client, prefix string) *Tally {
	return &Tally{c: c, prefix: prefix, now: time.Now}
}

// Record counts one purchase of sku: its outcome (purchase outcomes:
// accepted, sold_out, limit_reached, ...) and how long it took. The caller
// counts only SKUs of the catalog: junk ids must not make keys.
func (t *Tally) Record(sku, outcome string, d time.Duration) {
	sec := t.now().Unix()
	v, ok := t.skus.Load(sku)
	if !ok {
		v, _ = t.skus.LoadOrStore(sku, &skuTally{secs: map[int64]*counts{}})
	}
	s := v.(*skuTally)
	s.mu.Lock()
	c := s.secs[sec]
	if c == nil {
		c = &counts{outcomes: make(map[string]int64, 4)}
		s.secs[sec] = c
	}
	c.outcomes[outcome]++
	c.lat[bucketOf(d)]++
	s.last = sec
	s.mu.Unlock()
}

// Active returns the SKUs this instance counted a purchase of in the
// window before now: the ones whose gauges are worth sampling.
func (t *Tally) Active(now time.Time, window time.Duration) []string {
	since := now.Add(-window).Unix()
	var out []string
	t.skus.Range(func(k, v any) bool {
		s := v.(*skuTally)
		s.mu.Lock()
		last := s.last
		s.mu.Unlock()
		if last >= since {
			out = append(out, k.(string))
		}
		return true
	})
	return out
}

// Key names.
func (t *Tally) tag(sku string) string { return t.prefix + ":{hist:" + sku + "}" }
func (t *Tally) secKey(sku string, sec int64) string {
	return t.tag(sku) + ":" + strconv.FormatInt(sec, 10)
}
func (t *Tally) secsKey(sku string) string { return t.tag(sku) + ":secs" }

// Flush adds every second before now's (or every second, when all is
// true: at shutdown) to Redis and forgets it. Counts whose write fails are
// kept and retried on the next Flush, so none is lost to a Redis blip; a
// write that failed after Redis applied it counts twice (HINCRBY is not
// idempotent), which a history tolerates better than a loss. It returns the
// number of SKU-seconds written.
func (t *Tally) Flush(ctx context.Context, now time.Time, all bool) (int, error) {
	cur := now.Unix()
	written := 0
	var firstErr error
	t.skus.Range(func(k, v any) bool {
		sku, s := k.(string), v.(*skuTally)
		s.mu.Lock()
		ready := map[int64]*counts{}
		for sec, c := range s.secs {
			if all || sec < cur {
				ready[sec] = c
				delete(s.secs, sec)
			}
		}
		s.mu.Unlock()
		if len(ready) == 0 {
			return true
		}
		if err := t.write(ctx, sku, ready); err != nil {
			s.mu.Lock()
			for sec, c := range ready { // keep them for the next flush
				if old := s.secs[sec]; old != nil {
					for o, n := range c.outcomes {
						old.outcomes[o] += n
					}
					for i, n := range c.lat {
						old.lat[i] += n
					}
				} else {
					s.secs[sec] = c
				}
			}
			s.mu.Unlock()
			if firstErr == nil {
				firstErr = err
			}
			return true
		}
		written += len(ready)
		return true
	})
	return written, firstErr
}

func (t *Tally) write(ctx context.Context, sku string, ready map[int64]*counts) error {
	ttl := int64(Retention / time.Second)
	var cmds rueidis.Commands
	secs := t.secsKey(sku)
	for sec, c := range ready {
		key := t.secKey(sku, sec)
		var attempts int64
		for o, n := range c.outcomes {
			attempts += n
			cmds = append(cmds, t.c.B().Hincrby().Key(key).Field(o).Increment(n).Build())
		}
		cmds = append(cmds, t.c.B().Hincrby().Key(key).Field("attempts").Increment(attempts).Build())
		for i, n := range c.lat {
			if n > 0 {
				cmds = append(cmds, t.c.B().Hincrby().Key(key).Field(latField+strconv.Itoa(i)).Increment(n).Build())
			}
		}
		cmds = append(cmds, t.c.B().Expire().Key(key).Seconds(ttl).Build(),
			t.c.B().Zadd().Key(secs).ScoreMember().ScoreMember(float64(sec), strconv.FormatInt(sec, 10)).Build())
	}
	cmds = append(cmds, t.c.B().Expire().Key(secs).Seconds(ttl).Build())
	for _, r := range t.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

//go:embed max.lua
var maxLua string

var maxScript = rueidis.NewLuaScript(maxLua)

// Gauge fields sampled by Sample.
const (
	FieldBacklog = "backlog" // the SKU's reservations accepted by Redis and not yet in the database
	FieldQueue   = "queue"   // buyers waiting in the SKU's waiting room
)

// Sample keeps the largest value of field for sku in now's second: every
// instance samples, the maximum stands.
func (t *Tally) Sample(ctx context.Context, sku, field string, v int64, now time.Time) error {
	sec := strconv.FormatInt(now.Unix(), 10)
	return maxScript.Exec(ctx, t.c, []string{t.secKey(sku, now.Unix()), t.secsKey(sku)},
		[]string{field, strconv.FormatInt(v, 10), strconv.FormatInt(int64(Retention/time.Second), 10), sec}).Error()
}
