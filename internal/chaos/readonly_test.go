package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale/internal/testenv"
)

// readOnly turns a scenario's database read-only on the server side, as a
// switchover does for some seconds: connections and pings succeed, every
// write is refused (PostgreSQL: SQLSTATE 25006; MariaDB: 1290 with
// read_only set).
type readOnly struct {
	r      *rig
	dbName string
	admin  string // URL of the server's administrative database, as its superuser
	mysql  bool
}

// newReadOnly prepares the fault. On MariaDB the service then connects as a
// user of its own with every privilege on its database only: root (SUPER,
// READ ONLY ADMIN) bypasses read_only, and production does not run as root.
func newReadOnly(r *rig) *readOnly {
	name := strings.TrimPrefix(mustPath(r.t, r.dbURL), "/")
	ro := &readOnly{r: r, dbName: name, mysql: testenv.Dialect() == "mysql"}
	if !ro.mysql {
		ro.admin = r.db.URL("postgres")
		return ro
	}
	ro.admin = r.db.URL("")
	user := testenv.RandomName("fs_")
	ro.exec(fmt.Sprintf("CREATE USER '%s'@'%%'", user),
		fmt.Sprintf("GRANT ALL PRIVILEGES ON `%s`.* TO '%s'@'%%'", name, user))
	u, err := url.Parse(r.dbURL)
	if err != nil {
		r.t.Fatal(err)
	}
	u.User = url.User(user)
	r.set("FLASHSALE_DATABASE_URL", u.String())
	return ro
}

// on makes the database refuse writes. PostgreSQL: the database's
// default_transaction_read_only, then every session of the database is
// ended so that the new ones take it (the pool reconnects).
func (ro *readOnly) on() {
	if ro.mysql {
		ro.exec("SET GLOBAL read_only = 1")
		return
	}
	ro.exec("ALTER DATABASE "+pgx.Identifier{ro.dbName}.Sanitize()+" SET default_transaction_read_only = on",
		ro.terminate())
}

// off lets writes through again.
func (ro *readOnly) off() {
	if ro.mysql {
		ro.exec("SET GLOBAL read_only = 0")
		return
	}
	ro.exec("ALTER DATABASE "+pgx.Identifier{ro.dbName}.Sanitize()+" RESET default_transaction_read_only",
		ro.terminate())
}

func (ro *readOnly) terminate() string {
	return "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '" + ro.dbName + "' AND pid <> pg_backend_pid()"
}

func (ro *readOnly) exec(stmts ...string) {
	ro.r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if ro.mysql {
		u, err := url.Parse(ro.admin)
		if err != nil {
			ro.r.t.Fatal(err)
		}
		cfg := mysql.NewConfig()
		cfg.User, cfg.Net, cfg.Addr = u.User.Username(), "tcp", u.Host
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			ro.r.t.Fatal(err)
		}
		defer db.Close()
		for _, s := range stmts {
			if _, err := db.ExecContext(ctx, s); err != nil {
				ro.r.t.Fatalf("chaos: %s: %v", s, err)
			}
		}
		return
	}
	conn, err := pgx.Connect(ctx, ro.admin)
	if err != nil {
		ro.r.t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			ro.r.t.Fatalf("chaos: %s: %v", s, err)
		}
	}
}

// outageWatch polls s's /readyz and the dashboard's overview until stop is
// closed and reports what it saw: answers of /readyz other than 200, whether
// /readyz ever reported the consumer's write-refusal check
// (database-writes) unavailable, and whether the overview ever carried
// pipeline.database_outage.
func outageWatch(c *Client, stop <-chan struct{}) (wait func() (non200 int, ready, overview bool)) {
	var non200 int
	var ready, overview bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if r := c.Do(ctx, http.MethodGet, "/readyz", ""); r.Err == nil {
				if r.Status != http.StatusOK {
					non200++
				}
				if checks, _ := r.Body["checks"].(map[string]any); checks["database-writes"] == "unavailable" {
					ready = true
				}
			}
			if r := c.Do(ctx, http.MethodGet, "/admin/v1/overview", "", "Authorization: Bearer "+c.Admin); r.Status == http.StatusOK {
				if p, _ := r.Body["pipeline"].(map[string]any); p["database_outage"] != nil {
					overview = true
				}
			}
		}
	}()
	return func() (int, bool, bool) {
		<-done
		return non200, ready, overview
	}
}

// dbReadOnly: the database refuses writes for 8 s while buyers buy and it
// answers pings (a switchover). Purchases go on through Redis; the consumer
// must wait for the writes to come back, never dead-letter, and readiness
// must stay 200 while saying so.
//
// The writes are refused from before the first purchase: every order the
// consumer receives during the fault meets the refusal. (Refused 1.5 s
// into the load instead, the 300 units at 150 requests a second were all
// sold and applied before the refusal took effect on a loaded CI machine,
// and the consumer never met it.) The fault lasts until 8 s have passed
// and at least 20 purchases were accepted.
func dbReadOnly(r *rig) {
	ro := newReadOnly(r)
	s := r.start()
	c := r.client(s)
	r.putSKU(c, 300, 2)
	stop := make(chan struct{})
	watched := outageWatch(c, stop)
	ro.on()
	refused := time.Now()
	wait := r.load(c, Load{Buyers: 600, Workers: 16, Rate: 150, TwoKeys: 7, DoubleClick: 5, Tries: 8, For: 20 * time.Second})
	for len(r.hist.Accepted()) < 20 {
		if time.Since(refused) > time.Minute {
			r.t.Fatalf("chaos: %d purchases accepted in a minute of refused writes, want 20", len(r.hist.Accepted()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Until(refused.Add(8 * time.Second)))
	close(stop)
	ro.off()
	healed := time.Now()
	non200, ready, overview := watched()
	// The refusal reached the consumer: its error is in the log (at warn).
	r.res.fired = strings.Contains(s.Log(), "read-only") || strings.Contains(s.Log(), "read_only")
	if non200 > 0 {
		r.res.fail("readiness: %d answers other than 200 while purchases went on through Redis", non200)
	}
	if !ready {
		r.res.fail("readiness: never reported database-writes unavailable during 8 s of refused writes")
	}
	if !overview {
		r.res.fail("dashboard: the overview never carried pipeline.database_outage during 8 s of refused writes")
	}
	r.res.note = "8 s read-only"
	wait()
	r.finish(c, healed)
}
