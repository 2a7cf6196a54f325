package main

import (
	"context"
	"testing"
)

// TestExternalChangesAfterAuditTruncate: the token of an external
// change in the gate is 'ext-<stock_audit id>', kept in the SKU's rel set for
// the life of the sale. On MySQL/MariaDB, TRUNCATE stock_audit (an audit log
// retention purge) resets AUTO_INCREMENT, so later external changes get ids
// already in rel: restore.lua skips them as "already applied" and the
// restorer deletes the row. (On PostgreSQL TRUNCATE keeps the sequence.)
func TestExternalChangesAfterAuditTruncate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "embedded"))
	h.mustPutSKU("trunc", 10, 1)
	ctx := context.Background()
	erp(t, h.a.store, "trunc", 5)
	waitAvailable(t, h.a, "trunc", 15, 10e9)
	if _, err := h.a.store.DB().ExecContext(ctx, `TRUNCATE TABLE stock_audit`); err != nil {
		t.Fatal(err)
	}
	erp(t, h.a.store, "trunc", 3)
	erp(t, h.a.store, "trunc", 7)
	waitAvailable(t, h.a, "trunc", 25, 10e9)
}
