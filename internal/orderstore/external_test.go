package orderstore_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
)

// TestExternalChangeIDsMatchAudit: a multi-row ERP UPDATE writes one
// stock_audit row and one redis_restores row 'ext-<that audit id>-<uuid>' per row.
func TestExternalChangeIDsMatchAudit(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "EA", 10)
	putSKU(t, s, "EB", 10)
	execSQL(t, s, `UPDATE inventory SET stock = stock + 3 WHERE sku_id IN ('EA', 'EB')`)
	rows, err := s.DB().QueryContext(ctx, `SELECT a.id, a.sku_id, r.order_id, r.quantity FROM stock_audit a LEFT JOIN redis_restores r ON r.sku_id = a.sku_id
WHERE a.reason = 'external_change' ORDER BY a.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			id       int64
			sku, oid string
			q        int64
		)
		if err := rows.Scan(&id, &sku, &oid, &q); err != nil {
			t.Fatal(err)
		}
		n++
		if !strings.HasPrefix(oid, fmt.Sprintf("ext-%d-", id)) || len(oid) != len(fmt.Sprintf("ext-%d-", id))+36 || q != 3 {
			t.Errorf("%s: audit id %d, restore %s of %d", sku, id, oid, q)
		}
	}
	if n != 2 {
		t.Errorf("%d external rows, want 2", n)
	}
}

// TestExternalChangeAuditTimeIsUTC: the ERP's session time zone must
// not move the time an external change is recorded at (the schema says
// DATETIME(6) columns hold UTC; PostgreSQL stores timestamptz).
func TestExternalChangeAuditTimeIsUTC(t *testing.T) {
	s := newStore(t)
	ctx := testContext(t)
	putSKU(t, s, "TZ", 10)
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	setTZ := `SET time_zone = '+05:00'`
	if s.Dialect() == orderstore.Postgres {
		setTZ = `SET TIME ZONE '+05'`
	}
	if _, err := conn.ExecContext(ctx, setTZ); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, s.Rebind(`UPDATE inventory SET stock = stock + 1 WHERE sku_id = ?`), "TZ"); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	es, err := s.Audit(ctx, "TZ", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Reason != "external_change" {
			continue
		}
		if d := e.CreatedAt.Sub(before); d > time.Minute || d < -time.Minute {
			t.Errorf("external_change recorded at %s, %s away from now (%s)", e.CreatedAt, d, before.UTC())
		}
	}
	var created time.Time
	if err := s.DB().QueryRowContext(ctx, `SELECT created_at FROM redis_restores WHERE sku_id = 'TZ'`).Scan(&created); err != nil {
		t.Fatal(err)
	}
	if d := created.Sub(before); d > time.Minute || d < -time.Minute {
		t.Errorf("redis_restores row created at %s, %s away from now: PendingRestores (ORDER BY created_at) misorders it", created.UTC(), d)
	}
}
