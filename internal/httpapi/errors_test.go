package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

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
