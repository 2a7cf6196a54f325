package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashsale/flashsale/internal/invariant"
	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// Checker reads a deployment's database and Redis directly, never the
// service's own counters.
type Checker struct {
	Store *orderstore.Store
	Gate  *stockgate.Gate
}

// NewChecker connects to the database (directly, not through a scenario's
// proxy) and to Redis under prefix. It is closed on Cleanup.
func NewChecker(t testing.TB, dbURL, redisURL, prefix string) *Checker {
	t.Helper()
	ctx := context.Background()
	st, err := orderstore.Open(ctx, dbURL, orderstore.Options{MaxConns: 4})
	if err != nil {
		t.Fatalf("chaos: checker database: %v", err)
	}
	t.Cleanup(st.Close)
	opt, err := rueidis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	opt.DisableCache = true
	opt.Dialer.Timeout = time.Second
	rc, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("chaos: checker redis: %v", err)
	}
	t.Cleanup(rc.Close)
	return &Checker{Store: st, Gate: stockgate.New(rc, prefix)}
}

// Check reads sku once: I1, I2, I3 (when idle), I4 for the 202s of h, I5,
// I6 (internal/invariant), and I11 from h and the database.
func (c *Checker) Check(ctx context.Context, sku string, h *History, idle bool) (invariant.Report, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rep, err := invariant.Check(ctx, c.Store, c.Gate, sku, h.Accepted(), idle)
	if err != nil {
		return rep, nil, err
	}
	v := append([]string(nil), rep.Violations...)
	more, err := c.oneOrderPerKey(ctx, sku, h)
	if err != nil {
		return rep, nil, err
	}
	return rep, append(v, more...), nil
}

// oneOrderPerKey checks I11: the 202s for one (user, key) carry one order
// id, or, where the database fallback answered one of them (a retry it sold
// while the first attempt was in flight in a hung Redis, the documented
// case: docs/architecture.md), every id but at most one ended failed with
// duplicate_key in the database; no user holds more live
// orders than the distinct keys they used; and, where the orders table
// records the key, no key has two live orders.
func (c *Checker) oneOrderPerKey(ctx context.Context, sku string, h *History) ([]string, error) {
	type uk struct{ user, key string }
	ids := map[uk]map[string]bool{}
	fallback := map[uk]bool{} // a 202 of the key came from the database fallback
	keys := map[string]map[string]bool{}
	for _, a := range h.Attempts() {
		if keys[a.User] == nil {
			keys[a.User] = map[string]bool{}
		}
		keys[a.User][a.Key] = true
		if a.Status == http.StatusAccepted {
			k := uk{a.User, a.Key}
			if ids[k] == nil {
				ids[k] = map[string]bool{}
			}
			ids[k][a.OrderID] = true
			// The fallback answers with the order already in the
			// database (pending_payment); the gate with a queued one.
			if a.OrderStat == "pending_payment" {
				fallback[k] = true
			}
		}
	}
	var v []string
	twoLive, split := 0, 0
	for k, s := range ids {
		if len(s) < 2 {
			continue
		}
		if !fallback[k] {
			// Two paths did not serve this key: the gate itself gave it
			// two orders.
			split++
			continue
		}
		live := 0
		for id := range s {
			var status string
			var reason sql.NullString
			err := c.Store.DB().QueryRowContext(ctx, c.Store.Rebind(`SELECT status, fail_reason FROM orders WHERE order_id = ?`), id).Scan(&status, &reason)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return nil, fmt.Errorf("chaos: order %s: %w", id, err)
			}
			if err != nil || status != "failed" || reason.String != "duplicate_key" {
				live++
			}
		}
		if live > 1 {
			twoLive++
		}
	}
	if split > 0 {
		v = append(v, fmt.Sprintf("I11: %d keys were answered 202 with two or more order ids, none by the database fallback", split))
	}
	if twoLive > 0 {
		v = append(v, fmt.Sprintf("I11: %d keys were answered 202 with two or more order ids that did not end failed (duplicate_key)", twoLive))
	}

	rows, err := c.Store.DB().QueryContext(ctx, c.Store.Rebind(`
SELECT user_id, COUNT(*) FROM orders WHERE sku_id = ? AND status IN ('pending_payment','paid') GROUP BY user_id`), sku)
	if err != nil {
		return nil, fmt.Errorf("chaos: live orders by user: %w", err)
	}
	over, extra := 0, 0
	for rows.Next() {
		var user string
		var n int
		if err := rows.Scan(&user, &n); err != nil {
			rows.Close()
			return nil, err
		}
		if k, ok := keys[user]; ok && n > len(k) {
			over++
			extra += n - len(k)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if over > 0 {
		v = append(v, fmt.Sprintf("I11: %d users hold %d live orders more than the keys they used", over, extra))
	}
	col, err := c.keyColumn(ctx)
	if err != nil {
		return nil, err
	}
	if col != "" {
		var dup int
		q := `SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE sku_id = ? AND ` + col + ` IS NOT NULL AND ` + col +
			` <> '' AND status IN ('pending_payment','paid') GROUP BY user_id, ` + col + ` HAVING COUNT(*) > 1) d`
		if err := c.Store.DB().QueryRowContext(ctx, c.Store.Rebind(q), sku).Scan(&dup); err != nil {
			return nil, fmt.Errorf("chaos: live orders by key: %w", err)
		}
		if dup > 0 {
			v = append(v, fmt.Sprintf("I11: %d keys have two or more live orders in the database (%s)", dup, col))
		}
	}
	return v, nil
}

// keyColumn returns the column of orders that records the Idempotency-Key,
// or "" when the schema has none.
func (c *Checker) keyColumn(ctx context.Context) (string, error) {
	schema := "current_schema()"
	if c.Store.Dialect() == orderstore.MySQL {
		schema = "database()"
	}
	rows, err := c.Store.DB().QueryContext(ctx, `SELECT column_name FROM information_schema.columns
WHERE table_name = 'orders' AND table_schema = `+schema)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return "", err
		}
		cols = append(cols, strings.ToLower(name))
	}
	sort.Strings(cols)
	for _, name := range cols {
		if strings.Contains(name, "idempotency") || name == "request_key" || name == "idem_key" {
			return name, nil
		}
	}
	return "", rows.Err()
}

// Idle waits until sku is idle with every invariant holding and returns the
// time that took, or the last violations once within has passed.
func (c *Checker) Idle(ctx context.Context, sku string, h *History, within time.Duration) (time.Duration, invariant.Report, []string) {
	start := time.Now()
	var (
		rep invariant.Report
		v   []string
		err error
	)
	for {
		rep, v, err = c.Check(ctx, sku, h, true)
		if err != nil {
			v = []string{"check: " + err.Error()}
		} else if len(v) == 0 {
			return time.Since(start), rep, nil
		}
		if time.Since(start) > within {
			return time.Since(start), rep, v
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// DeadLetters returns how many messages the instance holds as dead letters.
func DeadLetters(ctx context.Context, c *Client) (int, error) {
	r := c.Do(ctx, http.MethodGet, "/admin/v1/dlq", "", "Authorization: Bearer "+c.Admin)
	if r.Status != http.StatusOK {
		if r.Err != nil {
			return 0, fmt.Errorf("dlq: %w", r.Err)
		}
		return 0, fmt.Errorf("dlq: %d %s", r.Status, strings.TrimSpace(r.Raw))
	}
	n, _ := r.Body["count"].(float64)
	return int(n), nil
}

// BuyRest checks I7: fresh buyers (recorded in h) can buy exactly the units
// the database says remain, then are told sold_out. It returns violations.
func BuyRest(ctx context.Context, c *Client, ck *Checker, sku string, h *History) []string {
	rep, err := invariant.Check(ctx, ck.Store, nil, sku, nil, false)
	if err != nil {
		return []string{"check: " + err.Error()}
	}
	left := rep.DBStock
	got := int64(0)
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; got < left && time.Now().Before(deadline); i++ {
		user := fmt.Sprintf("rest-%d", i)
		r := c.Buy(ctx, user, sku, 1, sku+"-"+user)
		a := Attempt{User: user, Key: sku + "-" + user, Try: 1, Status: r.Status, Code: r.Code()}
		if r.Status == http.StatusAccepted {
			a.OrderID = r.Str("order_id")
			got++
		}
		h.add(a)
		if r.Status != http.StatusAccepted {
			time.Sleep(100 * time.Millisecond) // a sold-out memory or a rebuild: ask again
		}
	}
	var v []string
	if got < left {
		v = append(v, fmt.Sprintf("I7: fresh buyers got %d of the %d units the database has left", got, left))
	}
	r := c.Buy(ctx, "rest-last", sku, 1, sku+"-rest-last")
	h.add(Attempt{User: "rest-last", Key: sku + "-rest-last", Try: 1, Status: r.Status, Code: r.Code(), OrderID: r.Str("order_id")})
	if r.Status == http.StatusAccepted {
		// Accepted is an oversell when the database refuses it. The fresh
		// buyers do not pay: with a short payment timeout (a scenario's
		// 2 s) their first orders may have been released meanwhile, and
		// then this buyer rightly got one of those units.
		id := r.Str("order_id")
		for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			o, err := ck.Store.Order(ctx, id)
			switch {
			case err == nil && o.Status == sale.StatusFailed:
				v = append(v, fmt.Sprintf("I7: a buyer was accepted after the database's stock was sold (oversold): order %s failed, %s", id, o.FailReason))
			case err == nil:
			case time.Now().After(end):
				v = append(v, fmt.Sprintf("I7: the last buyer's order %s did not reach the database: %v", id, err))
			default:
				continue
			}
			break
		}
	}
	return v
}
