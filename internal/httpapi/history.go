package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// HistoryAdmin is what the sale history admin routes need
// (salehistory.Recorder).
type HistoryAdmin interface {
	// Record computes and writes (or refreshes) sku's record as of now.
	// Errors: sale.ErrUnknownSKU, sale.ErrNoHistory.
	Record(ctx context.Context, sku string, now time.Time) (orderstore.SaleRecord, error)
	List(ctx context.Context, sku string, limit int) ([]orderstore.SaleRecord, error)
}

// saleRecordJSON is a sale_history row as the admin routes answer it.
type saleRecordJSON struct {
	SKU          string           `json:"sku_id"`
	Tag          string           `json:"tag"`
	StartsAt     apiTime          `json:"starts_at"`
	EndsAt       apiTime          `json:"ends_at"`
	RecordedAt   apiTime          `json:"recorded_at"`
	Stock        int64            `json:"stock"`
	Seconds      int64            `json:"seconds"`
	Attempts     int64            `json:"attempts"`
	Accepted     int64            `json:"accepted"`
	PeakAttempts int64            `json:"peak_attempts_per_second"`
	PeakAccepted int64            `json:"peak_accepted_per_second"`
	SellOutMS    *int64           `json:"sell_out_ms"`
	Buyers       int64            `json:"unique_buyers"`
	UnitsSold    int64            `json:"units_sold"`
	Refusals     map[string]int64 `json:"refusals"`
	P99MS        *float64         `json:"p99_ms"`
	BacklogMax   int64            `json:"backlog_max"`
	QueuePeak    *int64           `json:"queue_peak"`
	QueueJoins   *int64           `json:"queue_joins"`
	BotRefusals  *int64           `json:"bot_refusals"`
}

func saleRecordOf(r orderstore.SaleRecord) saleRecordJSON {
	out := saleRecordJSON{SKU: r.SKU, Tag: r.Tag, StartsAt: apiTime{r.StartsAt}, EndsAt: apiTime{r.EndsAt}, RecordedAt: apiTime{r.RecordedAt},
		Stock: r.Stock, Seconds: r.Seconds, Attempts: r.Attempts, Accepted: r.Accepted, PeakAttempts: r.PeakAttempts,
		PeakAccepted: r.PeakAccepted, Buyers: r.Buyers, UnitsSold: r.UnitsSold, Refusals: r.Refusals, BacklogMax: r.BacklogMax,
		QueuePeak: r.QueuePeak, QueueJoins: r.QueueJoins, BotRefusals: r.BotRefusals}
	if out.Refusals == nil {
		out.Refusals = map[string]int64{}
	}
	if r.SellOut >= 0 {
		ms := r.SellOut.Milliseconds()
		out.SellOutMS = &ms
	}
	if r.P99 >= 0 {
		p := r.P99
		out.P99MS = &p
	}
	return out
}

// listHistory answers the recorded sales, newest start first: every SKU's
// or ?sku_id='s, at most ?limit= (1..1000, default 100).
func (s *Server) listHistory(w http.ResponseWriter, r *http.Request) error {
	sku := r.URL.Query().Get("sku_id")
	if r.URL.Query().Has("sku_id") && !sale.ValidSKU(sku) {
		return errBadSKUID
	}
	limit, err := queryUint(r, "limit", 100)
	if err != nil || limit < 1 || limit > 1000 {
		return invalid("limit must be 1..1000")
	}
	rs, err := s.cfg.History.List(r.Context(), sku, int(limit))
	if err != nil {
		return err
	}
	out := make([]saleRecordJSON, len(rs))
	for i, rec := range rs {
		out[i] = saleRecordOf(rec)
	}
	writeJSON(w, http.StatusOK, map[string]any{"sales": out})
	return nil
}

// recordHistory records (or refreshes) sku_id's sale now: idempotent.
func (s *Server) recordHistory(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return errBadSKUID
	}
	rec, err := s.cfg.History.Record(r.Context(), id, requestTime(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, saleRecordOf(rec))
	return nil
}
