package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// Actions of a reconcile pass, per SKU.
const (
	ActionOK        = "ok"        // Redis agrees with the database, in-flight work considered
	ActionWatch     = "watch"     // unexplained drift seen for the first time: check again
	ActionCorrected = "corrected" // undersell, or small over-admission, seen twice: Redis re-synchronised from the database
	ActionAlert     = "alert"     // large over-admission seen twice: left alone, operators alerted
	ActionLoaded    = "loaded"    // Redis did not hold the sale: loaded from the database
)

// SKUReport is what one pass found for one SKU.
type SKUReport struct {
	SKU            string `json:"sku_id"`
	RedisAvailable int64  `json:"redis_available"`
	DBStock        int64  `json:"db_stock"`
	InFlight       int64  `json:"in_flight"`
	Drift          int64  `json:"drift"`
	Action         string `json:"action"`
}

// Report is one reconcile pass.
type Report struct {
	At   time.Time   `json:"at"`
	SKUs []SKUReport `json:"skus"`
}

// AuditStore records Redis-side corrections.
type AuditStore interface {
	AuditRedis(ctx context.Context, sku string, delta int64, reason string) error
}

// Observer exports drift and alerts (metrics); nil is fine.
type Observer interface {
	Drift(sku string, units int64)
	ReconcileAlert()
}

// Reconciler compares, per active SKU, Redis' available units with the
// database stock less the reservations in flight, and repairs or alerts.
//
// Drift is what in-flight work cannot explain. One pass reads Redis
// (available units, in-flight reservations and the reserved counter),
// then one database snapshot (stock, which reservations it has processed,
// releases whose Redis restore is pending), then the reserved counter again.
// raw = available - (stock - units in flight) is explained when it lies in
// [-(units of refusals and releases not yet given back in Redis),
// +(units reserved between the two Redis reads)]; drift is the distance
// outside that range. A drift seen in two consecutive passes (same sign) is
// corrected by a resync (which never re-sells in-flight units, and writes
// only if no unit moved since its read) when Redis is below what the
// database can sell (an undersell of any size: correcting it can only sell
// units the database has) or above it by at most Threshold units; Redis
// above by more (over-admission: something is wrong that a resync may
// hide) is alerted and left alone. The second sighting keeps a drift that
// in-flight work explains a moment later from being corrected.
type Reconciler struct {
	sync      *Syncer
	audit     AuditStore
	threshold int64
	webhook   string
	log       *slog.Logger
	obs       Observer
	hc        *http.Client

	mu   sync.Mutex
	last map[string]int64
	rep  *Report
}

// NewReconciler returns a reconciler. webhook, if set, receives alerts as JSON.
func NewReconciler(s *Syncer, audit AuditStore, threshold int64, webhook string, log *slog.Logger, obs Observer) *Reconciler {
	return &Reconciler{sync: s, audit: audit, threshold: threshold, webhook: webhook, log: log, obs: obs,
		hc: &http.Client{Timeout: 5 * time.Second}, last: map[string]int64{}}
}

// Last returns the most recent pass, or nil.
func (r *Reconciler) Last() *Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rep
}

// RunOnce reconciles skus once.
func (r *Reconciler) RunOnce(ctx context.Context, skus []string, now time.Time) (Report, error) {
	rep := Report{At: now.UTC(), SKUs: []SKUReport{}}
	var firstErr error
	for _, id := range skus {
		sr, err := r.one(ctx, id)
		if err != nil {
			r.log.Warn("reconcile", "sku_id", id, "err", err)
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", id, err)
			}
			continue
		}
		rep.SKUs = append(rep.SKUs, sr)
	}
	r.mu.Lock()
	r.rep = &rep
	r.mu.Unlock()
	return rep, firstErr
}

func (r *Reconciler) one(ctx context.Context, id string) (SKUReport, error) {
	s := r.sync
	f1, err := s.gate.ReadInFlight(ctx, id)
	if err != nil {
		return SKUReport{}, err
	}
	if !f1.Loaded {
		w, err := s.Warm(ctx, id)
		if err != nil {
			return SKUReport{}, err
		}
		if !w.Seeded {
			// Loaded between the read and the warm (another instance's PUT
			// seeded it): the warm re-synchronised it, nothing was loaded.
			return SKUReport{SKU: id, RedisAvailable: w.Available, DBStock: w.DBStock, InFlight: w.InFlight, Action: ActionOK}, nil
		}
		_ = r.audit.AuditRedis(ctx, id, w.Available, orderstore.AuditRedisReseed)
		return SKUReport{SKU: id, RedisAvailable: w.Available, DBStock: w.DBStock, InFlight: w.InFlight, Action: ActionLoaded}, nil
	}
	ids := make([]string, len(f1.Reservations))
	for i, res := range f1.Reservations {
		ids[i] = res.OrderID
	}
	snap, err := s.store.Snapshot(ctx, id, ids)
	if err != nil {
		return SKUReport{}, err
	}
	stock, processed, restores := snap.Stock, snap.Processed, snap.Restores
	f2, err := s.gate.ReadInFlight(ctx, id)
	if err != nil {
		return SKUReport{}, err
	}
	if f2.Epoch != f1.Epoch {
		// Re-seeded during the pass: the two reads describe different loads.
		return SKUReport{SKU: id, RedisAvailable: f2.Available, DBStock: snap.Stock, Action: ActionWatch}, nil
	}
	var flying, owed int64
	for _, res := range f1.Reservations {
		st, done := processed[res.OrderID]
		switch {
		case !done:
			flying += res.Quantity
		case st == sale.StatusFailed:
			owed += res.Quantity // refused: units go back to Redis
		}
	}
	var debit int64
	for _, rs := range restores {
		if rs.Quantity > 0 {
			owed += rs.Quantity // released: units go back to Redis
		} else {
			debit -= rs.Quantity // sold by the database fallback: Redis has yet to take them
		}
	}
	raw := f1.Available - (stock - flying)
	lo, hi := -owed, max(f2.Reserved-f1.Reserved, 0)+debit
	var drift int64
	switch {
	case raw > hi:
		drift = raw - hi
	case raw < lo:
		drift = raw - lo
	}
	sr := SKUReport{SKU: id, RedisAvailable: f1.Available, DBStock: stock, InFlight: flying, Drift: drift, Action: ActionOK}
	if r.obs != nil {
		r.obs.Drift(id, drift)
	}

	r.mu.Lock()
	prev := r.last[id]
	if drift == 0 {
		delete(r.last, id)
	} else {
		r.last[id] = drift
	}
	r.mu.Unlock()
	switch {
	case drift == 0:
		return sr, nil
	case prev == 0 || (prev > 0) != (drift > 0):
		sr.Action = ActionWatch
		return sr, nil
	case drift < 0 || drift <= r.threshold:
		w, err := s.Repair(ctx, id)
		if err != nil {
			return sr, err
		}
		if err := r.audit.AuditRedis(ctx, id, w.Available-f1.Available, orderstore.AuditRedisFix); err != nil {
			r.log.Warn("reconcile: audit", "sku_id", id, "err", err)
		}
		r.mu.Lock()
		delete(r.last, id)
		r.mu.Unlock()
		r.log.Warn("reconcile: corrected redis from the database", "sku_id", id, "drift", drift, "available_before", f1.Available, "available_after", w.Available)
		sr.Action = ActionCorrected
		return sr, nil
	}
	sr.Action = ActionAlert
	r.log.Error("reconcile: large drift between redis and the database; left alone for an operator",
		"sku_id", id, "drift", drift, "redis_available", f1.Available, "db_stock", stock, "in_flight", flying)
	if r.obs != nil {
		r.obs.ReconcileAlert()
	}
	r.notify(ctx, sr)
	return sr, nil
}

func (r *Reconciler) notify(ctx context.Context, sr SKUReport) {
	if r.webhook == "" {
		return
	}
	body, _ := json.Marshal(map[string]any{"alert": "reconcile_drift", "sku_id": sr.SKU, "drift": sr.Drift,
		"redis_available": sr.RedisAvailable, "db_stock": sr.DBStock, "in_flight": sr.InFlight, "at": time.Now().UTC()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.webhook, bytes.NewReader(body))
	if err != nil {
		r.log.Warn("reconcile: alert webhook", "err", err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.hc.Do(req)
	if err != nil {
		r.log.Warn("reconcile: alert webhook", "err", err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		r.log.Warn("reconcile: alert webhook answered", "status", resp.StatusCode)
	}
}

// Lease is held by one instance at a time.
type Lease interface {
	Acquire(ctx context.Context, name, owner string, ttl time.Duration) (bool, error)
	Release(ctx context.Context, name, owner string) error
}

// Run reconciles the SKUs active() returns every period, one instance at a
// time (under lease), until ctx ends.
func (r *Reconciler) Run(ctx context.Context, period time.Duration, lease Lease, owner string, active func() []string) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			ok, err := lease.Acquire(ctx, "reconciler", owner, 2*period+10*time.Second)
			if err != nil || !ok {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, 2*period+10*time.Second)
			if _, err := r.RunOnce(pctx, active(), now); err != nil && ctx.Err() == nil {
				r.log.Warn("reconcile pass", "err", err)
			}
			cancel()
			_ = lease.Release(context.WithoutCancel(ctx), "reconciler", owner)
		}
	}
}
