package salehistory

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// Store is the database of record's part the recorder needs (*orderstore.Store).
type Store interface {
	SKU(ctx context.Context, id string) (sale.SKU, error)
	SaleTotals(ctx context.Context, sku string) (units, buyers int64, err error)
	PutSaleRecord(ctx context.Context, r orderstore.SaleRecord, refresh bool) (bool, error)
	SaleRecords(ctx context.Context, sku string, limit int) ([]orderstore.SaleRecord, error)
}

// Grace is how long after a sale's end the recorder waits, so that every
// instance has flushed its last seconds (they flush every second).
const Grace = 5 * time.Second

// botOutcomes are the refusals counted as bot refusals: no valid ticket
// (the proof of work was skipped) and the risk lists. not_admitted is a
// buyer waiting their turn, not a bot.
var botOutcomes = []string{"ticket_required", "blocked"}

// Recorder computes and records sale_history rows. Safe for concurrent use.
type Recorder struct {
	c     rueidis.Client
	t     *Tally // for the key names
	store Store
	// Joined, if set, returns how many buyers ever joined sku's waiting room.
	Joined func(ctx context.Context, sku string) (int64, error)
	log    *slog.Logger
	mu     sync.Mutex
	done   map[string]bool // sku@ends_at recorded (or found recorded) by this instance
}

// NewRecorder returns a recorder reading the counts t writes.
func NewRecorder(t *Tally, store Store, log *slog.Logger) *Recorder {
	return &Recorder{c: t.c, t: t, store: store, log: log, done: map[string]bool{}}
}

// Summary computes sku's record as of now from the counts in Redis and the
// orders in the database. The sale's window bounds the seconds read; a sale
// without a start starts at its first counted second, one without an end
// (or not ended yet) ends now. Errors: sale.ErrNoHistory when there is
// nothing to record.
func (r *Recorder) Summary(ctx context.Context, s sale.SKU, now time.Time) (orderstore.SaleRecord, error) {
	now = now.UTC()
	if !s.StartsAt.IsZero() && now.Before(s.StartsAt) {
		return orderstore.SaleRecord{}, fmt.Errorf("%w: %s starts at %s", sale.ErrNoHistory, s.ID, s.StartsAt.UTC().Format(time.RFC3339))
	}
	from, to := int64(0), now.Unix()
	if !s.StartsAt.IsZero() {
		from = s.StartsAt.Unix()
	}
	if !s.EndsAt.IsZero() && s.EndsAt.Before(now) {
		to = s.EndsAt.Unix()
	}
	secs, err := r.c.Do(ctx, r.c.B().Zrangebyscore().Key(r.t.secsKey(s.ID)).Min(strconv.FormatInt(from, 10)).Max(strconv.FormatInt(to, 10)).Build()).AsStrSlice()
	if err != nil {
		return orderstore.SaleRecord{}, fmt.Errorf("salehistory: %s: %w", s.ID, err)
	}
	rec := orderstore.SaleRecord{SKU: s.ID, Tag: s.Tag, StartsAt: s.StartsAt.UTC(), EndsAt: time.Unix(to, 0).UTC(), RecordedAt: now,
		Stock: s.TotalStock, SellOut: -1, P99: -1, Refusals: map[string]int64{}}
	if !s.EndsAt.IsZero() && s.EndsAt.Before(now) {
		rec.EndsAt = s.EndsAt.UTC()
	}
	if s.StartsAt.IsZero() {
		if len(secs) == 0 {
			return orderstore.SaleRecord{}, fmt.Errorf("%w: %s has no start and no counted purchase", sale.ErrNoHistory, s.ID)
		}
		first, _ := strconv.ParseInt(secs[0], 10, 64)
		rec.StartsAt = time.Unix(first, 0).UTC()
	}
	cmds := make(rueidis.Commands, len(secs))
	for i, sec := range secs {
		cmds[i] = r.c.B().Hgetall().Key(r.t.tag(s.ID) + ":" + sec).Build()
	}
	var lat [latBuckets]int64
	var queuePeak int64
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		h, err := res.AsIntMap()
		if err != nil {
			return orderstore.SaleRecord{}, fmt.Errorf("salehistory: %s second %s: %w", s.ID, secs[i], err)
		}
		sec, _ := strconv.ParseInt(secs[i], 10, 64)
		for f, n := range h {
			switch {
			case f == "attempts":
				rec.Attempts += n
				rec.PeakAttempts = max(rec.PeakAttempts, n)
				if n > 0 {
					rec.Seconds++
				}
			case f == "accepted":
				rec.Accepted += n
				rec.PeakAccepted = max(rec.PeakAccepted, n)
			case f == FieldBacklog:
				rec.BacklogMax = max(rec.BacklogMax, n)
			case f == FieldQueue:
				queuePeak = max(queuePeak, n)
			case strings.HasPrefix(f, latField):
				if b, err := strconv.Atoi(f[len(latField):]); err == nil && b >= 0 && b < latBuckets {
					lat[b] += n
				}
			default:
				rec.Refusals[f] += n
				if f == "sold_out" && n > 0 {
					at := time.Unix(sec, 0).Sub(rec.StartsAt)
					if rec.SellOut < 0 || at < rec.SellOut {
						rec.SellOut = max(0, at)
					}
				}
			}
		}
	}
	rec.P99 = p99(lat)
	if rec.UnitsSold, rec.Buyers, err = r.store.SaleTotals(ctx, s.ID); err != nil {
		return orderstore.SaleRecord{}, err
	}
	if s.Crowd.TicketRequired || s.Crowd.WaitingRoom {
		var bots int64
		for _, o := range botOutcomes {
			bots += rec.Refusals[o]
		}
		rec.BotRefusals = &bots
	}
	if s.Crowd.WaitingRoom {
		rec.QueuePeak = &queuePeak
		if r.Joined != nil {
			if n, err := r.Joined(ctx, s.ID); err == nil {
				rec.QueueJoins = &n
			} else {
				r.log.Warn("sale history: waiting room joins not read", "sku_id", s.ID, "err", err)
			}
		}
	}
	return rec, nil
}

// p99 is the upper bound, in ms, of the bucket holding the 99th
// percentile; -1 for no latency.
func p99(lat [latBuckets]int64) float64 {
	var total int64
	for _, n := range lat {
		total += n
	}
	if total == 0 {
		return -1
	}
	rank := int64(math.Ceil(0.99 * float64(total)))
	var seen int64
	for i, n := range lat {
		if seen += n; seen >= rank {
			return float64(bucketBound(i)) / float64(time.Millisecond)
		}
	}
	return float64(bucketBound(latBuckets-1)) / float64(time.Millisecond)
}

// Record computes sku's record as of now and writes it, replacing any row
// of the same sale (on demand: idempotent, a refresh). Errors:
// sale.ErrUnknownSKU, sale.ErrNoHistory.
func (r *Recorder) Record(ctx context.Context, sku string, now time.Time) (orderstore.SaleRecord, error) {
	s, err := r.store.SKU(ctx, sku)
	if err != nil {
		return orderstore.SaleRecord{}, err
	}
	rec, err := r.Summary(ctx, s, now)
	if err != nil {
		return orderstore.SaleRecord{}, err
	}
	if _, err := r.store.PutSaleRecord(ctx, rec, true); err != nil {
		return orderstore.SaleRecord{}, err
	}
	return rec, nil
}

// List returns the recorded sales, newest first (of sku if not "").
func (r *Recorder) List(ctx context.Context, sku string, limit int) ([]orderstore.SaleRecord, error) {
	return r.store.SaleRecords(ctx, sku, limit)
}

// RunOnce records every sale of skus that ended at least Grace before now
// (and less than Retention ago, while its counts are still in Redis) and
// that this instance has not seen recorded. Every instance runs it; the
// row's key (SKU and start) lets exactly one write: the others find it
// written. It returns the number of rows this instance wrote.
func (r *Recorder) RunOnce(ctx context.Context, skus []sale.SKU, now time.Time) (int, error) {
	written := 0
	var firstErr error
	for _, s := range skus {
		if s.EndsAt.IsZero() || now.Before(s.EndsAt.Add(Grace)) || now.Sub(s.EndsAt) > Retention {
			continue
		}
		key := s.ID + "@" + s.EndsAt.UTC().Format(time.RFC3339Nano)
		r.mu.Lock()
		done := r.done[key]
		r.mu.Unlock()
		if done {
			continue
		}
		rec, err := r.Summary(ctx, s, now)
		if err == nil {
			var w bool
			if w, err = r.store.PutSaleRecord(ctx, rec, false); w {
				written++
				r.log.Info("sale recorded", "sku_id", s.ID, "peak_attempts", rec.PeakAttempts, "units_sold", rec.UnitsSold)
			}
		}
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		r.mu.Lock()
		r.done[key] = true
		r.mu.Unlock()
	}
	return written, firstErr
}

// Run flushes t and samples every second, and records ended sales every
// period, until ctx ends; then it flushes what is left. skus lists the
// catalog's sales; sample, if set, is called once a second to sample the
// gauges (backlog, queue).
func (r *Recorder) Run(ctx context.Context, period time.Duration, skus func() []sale.SKU, sample func(ctx context.Context, now time.Time)) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := time.Time{}
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if _, err := r.t.Flush(fctx, time.Now(), true); err != nil {
				r.log.Warn("sale history: last flush", "err", err)
			}
			cancel()
			return
		case now := <-tick.C:
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			if _, err := r.t.Flush(cctx, now, false); err != nil {
				r.log.Warn("sale history: flush", "err", err)
			}
			if sample != nil {
				sample(cctx, now)
			}
			cancel()
			if now.Sub(last) >= period {
				last = now
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if _, err := r.RunOnce(rctx, skus(), now); err != nil {
					r.log.Warn("sale history: record", "err", err)
				}
				cancel()
			}
		}
	}
}
