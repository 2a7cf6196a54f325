package orderstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// SaleRecord is one row of sale_history: what one sale of one SKU did,
// summed over every instance (internal/salehistory computes it).
type SaleRecord struct {
	SKU        string
	Tag        string    // the SKU's tag when the sale was recorded
	StartsAt   time.Time // the key with SKU: the sale's start (its first counted second if it had none)
	EndsAt     time.Time
	RecordedAt time.Time
	Stock      int64 // units offered (inventory total_stock)
	Seconds    int64 // seconds with at least one attempt counted
	Attempts   int64
	Accepted   int64
	// PeakAttempts and PeakAccepted are the largest one-second sums.
	PeakAttempts, PeakAccepted int64
	// SellOut is the time from the start to the first sold-out refusal;
	// negative: the sale never sold out.
	SellOut   time.Duration
	Buyers    int64 // distinct users holding a live order (pending_payment or paid)
	UnitsSold int64 // units of those orders
	Refusals  map[string]int64
	// P99 is the 99th percentile of the purchase path's latency, in ms, from
	// the instances' merged histograms; negative: nothing was measured.
	P99        float64
	BacklogMax int64
	// QueuePeak, QueueJoins and BotRefusals are set for a sale with a
	// waiting room or tickets (Crowd); nil otherwise.
	QueuePeak, QueueJoins, BotRefusals *int64
}

// Dialect-neutral statements, rebound per dialect.
const (
	historyColumns = `sku_id, tag, starts_at, ends_at, recorded_at, stock, seconds, attempts, accepted, peak_attempts, peak_accepted,
    sell_out_ms, buyers, units_sold, refusals, p99_ms, backlog_max, queue_peak, queue_joins, bot_refusals`
	historyValues = `?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?`
	historyUpdate = `tag = %[1]stag%[2]s, ends_at = %[1]sends_at%[2]s, recorded_at = %[1]srecorded_at%[2]s, stock = %[1]sstock%[2]s, seconds = %[1]sseconds%[2]s,
    attempts = %[1]sattempts%[2]s, accepted = %[1]saccepted%[2]s, peak_attempts = %[1]speak_attempts%[2]s, peak_accepted = %[1]speak_accepted%[2]s,
    sell_out_ms = %[1]ssell_out_ms%[2]s, buyers = %[1]sbuyers%[2]s, units_sold = %[1]sunits_sold%[2]s, refusals = %[1]srefusals%[2]s,
    p99_ms = %[1]sp99_ms%[2]s, backlog_max = %[1]sbacklog_max%[2]s, queue_peak = %[1]squeue_peak%[2]s, queue_joins = %[1]squeue_joins%[2]s,
    bot_refusals = %[1]sbot_refusals%[2]s`
	saleTotalsSQL = `SELECT coalesce(sum(quantity), 0), count(DISTINCT user_id) FROM orders
WHERE sku_id = ? AND status IN ('pending_payment', 'paid')`
	historySQL = `SELECT ` + historyColumns + ` FROM sale_history
WHERE (? = '' OR sku_id = ?) ORDER BY starts_at DESC, sku_id LIMIT ?`
)

func (s *Store) historyInsert(refresh bool) string {
	if s.dialect == MySQL {
		if refresh {
			return `INSERT INTO sale_history (` + historyColumns + `) VALUES (` + historyValues + `)
ON DUPLICATE KEY UPDATE ` + fmt.Sprintf(historyUpdate, "VALUES(", ")")
		}
		return `INSERT IGNORE INTO sale_history (` + historyColumns + `) VALUES (` + historyValues + `)`
	}
	q := `INSERT INTO sale_history (` + historyColumns + `) VALUES (` + historyValues + `) ON CONFLICT (sku_id, starts_at) DO `
	if refresh {
		q += `UPDATE SET ` + fmt.Sprintf(historyUpdate, "excluded.", "")
	} else {
		q += `NOTHING`
	}
	return s.Rebind(q)
}

// PutSaleRecord writes r. With refresh false it writes only if no row of
// r's SKU and start exists (every instance may try; one row is written) and
// reports whether it wrote; with refresh true it writes or replaces the
// row (written is then always true).
func (s *Store) PutSaleRecord(ctx context.Context, r SaleRecord, refresh bool) (written bool, err error) {
	ref, err := json.Marshal(r.Refusals)
	if err != nil {
		return false, err
	}
	if r.Refusals == nil {
		ref = []byte("{}")
	}
	var sellOut, p99 any
	if r.SellOut >= 0 {
		sellOut = r.SellOut.Milliseconds()
	}
	if r.P99 >= 0 {
		p99 = r.P99
	}
	res, err := s.DB().ExecContext(ctx, s.historyInsert(refresh), r.SKU, r.Tag, dbTime(r.StartsAt), dbTime(r.EndsAt), dbTime(r.RecordedAt),
		r.Stock, r.Seconds, r.Attempts, r.Accepted, r.PeakAttempts, r.PeakAccepted, sellOut, r.Buyers, r.UnitsSold, string(ref), p99,
		r.BacklogMax, nullInt(r.QueuePeak), nullInt(r.QueueJoins), nullInt(r.BotRefusals))
	if err != nil {
		return false, fmt.Errorf("orderstore: put sale record %s: %w", r.SKU, err)
	}
	if refresh {
		return true, nil
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

func nullInt(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// SaleRecords lists sale_history, newest start first: every SKU's, or
// sku's when it is not "", at most limit rows.
func (s *Store) SaleRecords(ctx context.Context, sku string, limit int) ([]SaleRecord, error) {
	rows, err := s.DB().QueryContext(ctx, s.Rebind(historySQL), sku, sku, limit)
	if err != nil {
		return nil, fmt.Errorf("orderstore: sale records: %w", err)
	}
	defer rows.Close()
	var out []SaleRecord
	for rows.Next() {
		var (
			r                 SaleRecord
			sellOut           sql.NullInt64
			p99               sql.NullFloat64
			ref               string
			peak, joins, bots sql.NullInt64
		)
		if err := rows.Scan(&r.SKU, &r.Tag, &r.StartsAt, &r.EndsAt, &r.RecordedAt, &r.Stock, &r.Seconds, &r.Attempts, &r.Accepted,
			&r.PeakAttempts, &r.PeakAccepted, &sellOut, &r.Buyers, &r.UnitsSold, &ref, &p99, &r.BacklogMax, &peak, &joins, &bots); err != nil {
			return nil, fmt.Errorf("orderstore: sale records: %w", err)
		}
		r.StartsAt, r.EndsAt, r.RecordedAt = r.StartsAt.UTC(), r.EndsAt.UTC(), r.RecordedAt.UTC()
		r.SellOut, r.P99 = -1, -1
		if sellOut.Valid {
			r.SellOut = time.Duration(sellOut.Int64) * time.Millisecond
		}
		if p99.Valid {
			r.P99 = p99.Float64
		}
		if err := json.Unmarshal([]byte(ref), &r.Refusals); err != nil {
			return nil, fmt.Errorf("orderstore: sale record %s: refusals: %w", r.SKU, err)
		}
		r.QueuePeak, r.QueueJoins, r.BotRefusals = intPtr(peak), intPtr(joins), intPtr(bots)
		out = append(out, r)
	}
	return out, rows.Err()
}

func intPtr(n sql.NullInt64) *int64 {
	if !n.Valid {
		return nil
	}
	return &n.Int64
}

// SaleTotals returns the units of sku's live orders (pending_payment or
// paid) and the number of distinct buyers holding them: exact, from the
// database of record.
func (s *Store) SaleTotals(ctx context.Context, sku string) (units, buyers int64, err error) {
	if err := s.DB().QueryRowContext(ctx, s.Rebind(saleTotalsSQL), sku).Scan(&units, &buyers); err != nil {
		return 0, 0, fmt.Errorf("orderstore: sale totals %s: %w", sku, err)
	}
	return units, buyers, nil
}
