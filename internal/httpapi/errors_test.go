package httpapi

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

// TestPlainJSON: a byte plainJSON passes is one encoding/json writes as it
// is between quotes, so writeAccepted's bytes are writeJSON's; it passes
// every printable ASCII byte but " \ < > & (DEL it leaves to writeJSON).
func TestPlainJSON(t *testing.T) {
	for c := 0; c < 256; c++ {
		s := string([]byte{byte(c)})
		j, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		asIs := string(j) == `"`+s+`"`
		if want := asIs && c >= 0x20 && c < 0x7f; plainJSON(s) != want {
			t.Errorf("byte %#x: plainJSON %v, encoding/json writes %s", c, plainJSON(s), j)
		}
	}
}

// TestDeadlineIsUnavailable: work that ran out of its time (the request's
// deadline passed during a database or Redis call: a hot row under a crowd
// of cancels, a lock wait on a busy machine) is answered 503 unavailable
// with Retry-After, as any other "retry shortly", never 500 internal; a
// more specific error wrapped beside it keeps its own code.
func TestDeadlineIsUnavailable(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("orderstore: release 01: %w", context.DeadlineExceeded), 503, "unavailable"},
		{fmt.Errorf("sku c change lock: %w", context.DeadlineExceeded), 503, "unavailable"},
		{fmt.Errorf("gate: %w (%w)", context.DeadlineExceeded, sale.ErrBusy), 503, "busy"},
		{fmt.Errorf("%w: %w", sale.ErrSoldOut, context.DeadlineExceeded), 409, "sold_out"},
		{errors.New("something else"), 500, "internal"},
	} {
		rec := httptest.NewRecorder()
		writeError(rec, httptest.NewRequest(http.MethodGet, "/", nil), slog.New(slog.DiscardHandler), tc.err)
		var b errorBody
		_ = json.Unmarshal(rec.Body.Bytes(), &b)
		if rec.Code != tc.status || b.Error.Code != tc.code {
			t.Errorf("%v: %d %s, want %d %s", tc.err, rec.Code, b.Error.Code, tc.status, tc.code)
		}
		if tc.status == 503 && rec.Header().Get("Retry-After") == "" {
			t.Errorf("%v: 503 without Retry-After", tc.err)
		}
	}
}

// lateLifecycle is a Lifecycle whose calls outlast the request's time and
// then fail as a database driver does once the context ended the
// transaction: with an error that does not wrap the context's.
type lateLifecycle struct{}

func (lateLifecycle) Pay(ctx context.Context, user, id, ref string) (sale.Order, error) {
	<-ctx.Done()
	return sale.Order{}, fmt.Errorf("orderstore: release %s: %w", id, sql.ErrTxDone)
}

func (l lateLifecycle) Cancel(ctx context.Context, user, id string) (sale.Order, error) {
	return l.Pay(ctx, user, id, "")
}

// TestRequestOutOfTimeIsUnavailable: a request whose work ran past its
// deadline and failed with database/sql's "transaction has already been
// committed or rolled back" (the context rolled the transaction back: a
// MariaDB cancel under a crowd answered 500 and the buyer did not retry) is
// answered 503 unavailable, so the client retries.
func TestRequestOutOfTimeIsUnavailable(t *testing.T) {
	s := New(nil, nil, slog.New(slog.DiscardHandler), Config{
		Users: NewUserAuth("s3cret"), Lifecycle: lateLifecycle{}, Timeout: 50 * time.Millisecond,
	})
	tok, err := Sign("s3cret", "u1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/api/v1/orders/01a23b0b-7c78-8b5b-97fc-00dfc22dc57f/cancel", "/api/v1/orders/01a23b0b-7c78-8b5b-97fc-00dfc22dc57f/pay"} {
		req := httptest.NewRequest(http.MethodPost, path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		var b errorBody
		_ = json.Unmarshal(rec.Body.Bytes(), &b)
		if rec.Code != http.StatusServiceUnavailable || b.Error.Code != "unavailable" || rec.Header().Get("Retry-After") == "" {
			t.Errorf("%s past its deadline: %d %s, want 503 unavailable with Retry-After", path, rec.Code, rec.Body)
		}
	}
}

// failingLifecycle is a Lifecycle whose calls fail at once with err.
type failingLifecycle struct{ err error }

func (f failingLifecycle) Pay(context.Context, string, string, string) (sale.Order, error) {
	return sale.Order{}, f.err
}

func (f failingLifecycle) Cancel(context.Context, string, string) (sale.Order, error) {
	return sale.Order{}, f.err
}

// TestTransientIsUnavailable: a failure Config.Transient calls transient (a
// lock wait the database gave up: a pay under a crowd answered 500 and the
// payer did not retry) is answered 503 unavailable with Retry-After; a
// transient failure that also carries a specific error keeps that error's
// code, and a failure that is not transient stays 500.
func TestTransientIsUnavailable(t *testing.T) {
	lockTimeout := errors.New("ERROR: canceling statement due to lock timeout (SQLSTATE 55P03)")
	transient := func(err error) bool { return errors.Is(err, lockTimeout) }
	tok, err := Sign("s3cret", "u1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("orderstore: pay x: %w", lockTimeout), 503, "unavailable"},
		{fmt.Errorf("%w (%w)", sale.ErrOrderExpired, lockTimeout), 409, "order_expired"},
		{errors.New("a bug"), 500, "internal"},
	} {
		s := New(nil, nil, slog.New(slog.DiscardHandler), Config{Users: NewUserAuth("s3cret"), Lifecycle: failingLifecycle{tc.err}, Transient: transient})
		req := httptest.NewRequest(http.MethodPost, "/api/v1/orders/01a23b0b-7c78-8b5b-97fc-00dfc22dc57f/pay", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		var b errorBody
		_ = json.Unmarshal(rec.Body.Bytes(), &b)
		if rec.Code != tc.status || b.Error.Code != tc.code || (tc.status == 503) != (rec.Header().Get("Retry-After") != "") {
			t.Errorf("%v: %d %s (Retry-After %q), want %d %s", tc.err, rec.Code, b.Error.Code, rec.Header().Get("Retry-After"), tc.status, tc.code)
		}
	}
}
