package orderqueue

import (
	"context"
	"errors"
	"testing"
)

// TestPublishHealth: rounds whose every message failed count in a row; one
// acknowledged message resets the count; a cancelled round counts for nothing.
func TestPublishHealth(t *testing.T) {
	down := errors.New("no ack")
	for _, tc := range []struct {
		name    string
		rounds  [][]error
		failing bool
		count   int
		total   uint64
	}{
		{"none", nil, false, 0, 0},
		{"two failed", [][]error{{down}, {down, down}}, false, 2, 2},
		{"three failed", [][]error{{down}, {down}, {context.DeadlineExceeded}}, true, 3, 3},
		{"one acked in a round", [][]error{{down}, {down}, {down, nil}}, false, 0, 2},
		{"reset then failed", [][]error{{down}, {down}, {down}, {nil}, {down}}, false, 1, 4},
		{"cancelled", [][]error{{down}, {down}, {context.Canceled}}, false, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p pubHealth
			for _, r := range tc.rounds {
				p.record(r)
			}
			if p.h.Failing != tc.failing || p.h.Failures != tc.count || p.h.Total != tc.total {
				t.Fatalf("got %+v, want failing %v, %d in a row, %d in all", p.h, tc.failing, tc.count, tc.total)
			}
			if tc.count > 0 && (p.h.Since.IsZero() || p.h.Err == nil) {
				t.Fatalf("got %+v: no start or error", p.h)
			}
		})
	}
}
