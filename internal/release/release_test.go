package release_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/release"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestRestorerPagesPastUnloadedSKU: more than a page of give-backs owed to
// a SKU Redis does not hold (being rebuilt) must not starve the others:
// the one owed to a loaded SKU, newer than all of them, is applied.
func TestRestorerPagesPastUnloadedSKU(t *testing.T) {
	ctx := t.Context()
	st, err := orderstore.Open(ctx, testenv.Database(t), orderstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	g := stockgate.New(c, prefix)
	if ok, err := g.Seed(ctx, "HOT", stockgate.Config{PerUserLimit: 5}, 10, map[string]int64{"hal": 2}, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatal(ok, err)
	}

	old := time.Now().UTC().Add(-time.Hour)
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ins := st.Rebind(`INSERT INTO redis_restores (order_id, sku_id, user_id, quantity, created_at) VALUES (?, ?, ?, ?, ?)`)
	for i := range 501 {
		if _, err := tx.ExecContext(ctx, ins, fmt.Sprintf("cold-%d", i), "COLD", "u", 1, old.Add(time.Duration(i)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.ExecContext(ctx, ins, "hot-1", "HOT", "hal", 2, time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	svc := release.New(st, g, nil, func(string) bool { return true }, slog.New(slog.DiscardHandler))
	n, err := svc.RestoreOnce(ctx)
	if err != nil || n != 1 {
		t.Fatalf("RestoreOnce = %d, %v; want the loaded SKU's 1", n, err)
	}
	if got, _, _ := g.Available(ctx, "HOT"); got != 12 {
		t.Fatalf("HOT available %d, want 12", got)
	}
	var left int
	if err := st.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM redis_restores`).Scan(&left); err != nil || left != 501 {
		t.Fatalf("%d restores left (%v), want the unloaded SKU's 501", left, err)
	}
}
