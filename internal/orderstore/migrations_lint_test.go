package orderstore

import (
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The rules every migration follows (docs/releasing.md, "Migrations"): the
// previous release keeps running on the schema a new release migrates to,
// and serve migrates at start-up while purchases are being written.
//
//   - Expand only: no DROP TABLE / COLUMN / INDEX / KEY, no RENAME, no change
//     of a column's type, no TRUNCATE. A destructive change waits until no
//     running release reads what it removes, and comes as its own migration
//     in a later release (after it is allow-listed here with its reason).
//   - An index on an existing table is built without blocking writes:
//     PostgreSQL CREATE INDEX CONCURRENTLY in a file marked
//     -- +goose NO TRANSACTION (CONCURRENTLY cannot run in a transaction);
//     MySQL/MariaDB ALTER TABLE ... ADD INDEX / CREATE INDEX with
//     ALGORITHM=INPLACE, LOCK=NONE. An index on a table created in the same
//     file is free (the table is empty).
//
// Only the Up section is read: a Down section undoes its own Up.

// migrationHistory lists the migrations that broke a rule before the rules
// were enforced, with the reason each is kept. They have run on every
// deployed database; rewriting them would make those databases differ from
// new ones. No file may be added here: a new migration follows the rules.
var migrationHistory = map[string]string{
	"postgres/00002_idempotency_key.sql":  "plain CREATE INDEX on orders; released before the rules, kept as applied",
	"postgres/00003_lifecycle.sql":        "plain CREATE INDEX orders_expiry_idx on orders; released before the rules",
	"postgres/00006_external_changes.sql": "plain CREATE INDEX on stock_audit; released before the rules",
	"postgres/00009_one_order_per_key.sql": "drops orders_idempotency_idx and rebuilds it UNIQUE inside serve's start-up " +
		"migration's transaction, blocking every write to orders (purchases) while it builds; the pattern this lint forbids",
	"mysql/00002_one_order_per_key.sql": "DROP KEY + ADD UNIQUE KEY on orders without ALGORITHM=INPLACE, LOCK=NONE; " +
		"the MySQL twin of postgres/00009",
}

var (
	reUpSection     = regexp.MustCompile(`(?s)--\s*\+goose Up(.*?)(--\s*\+goose Down|\z)`)
	reNoTransaction = regexp.MustCompile(`(?m)^--\s*\+goose NO TRANSACTION\s*$`)
	reLineComment   = regexp.MustCompile(`--[^\n]*`)
	reSpaces        = regexp.MustCompile(`\s+`)

	reCreateTable = regexp.MustCompile(`^CREATE (?:TEMPORARY )?TABLE (?:IF NOT EXISTS )?(\S+)`)
	// CREATE [UNIQUE] INDEX [CONCURRENTLY] [IF NOT EXISTS] [name] ON [ONLY] table
	reCreateIndex = regexp.MustCompile(`^CREATE (?:UNIQUE )?INDEX (CONCURRENTLY )?(?:IF NOT EXISTS )?(?:\S+ )?ON (?:ONLY )?([^\s(]+)`)
	reAlterTable  = regexp.MustCompile(`^ALTER TABLE (?:ONLY )?(?:IF EXISTS )?(\S+)`)
	reAddIndex    = regexp.MustCompile(`\bADD (?:CONSTRAINT \S+ )?(?:UNIQUE |PRIMARY |FULLTEXT |SPATIAL )?(?:INDEX|KEY)\b|\bADD (?:CONSTRAINT \S+ )?UNIQUE\b`)
	reOnline      = regexp.MustCompile(`\bALGORITHM\s*=\s*INPLACE\b`)
	reNoLock      = regexp.MustCompile(`\bLOCK\s*=\s*NONE\b`)
	reUsingIndex  = regexp.MustCompile(`\bUSING INDEX\b`)

	reDestructive = []struct {
		re   *regexp.Regexp
		what string
	}{
		{regexp.MustCompile(`^DROP TABLE\b`), "DROP TABLE"},
		{regexp.MustCompile(`^DROP INDEX\b`), "DROP INDEX"},
		{regexp.MustCompile(`\bDROP (?:COLUMN\b|(?:IF EXISTS )?[A-Z_"]+\s*(?:,|$))`), "DROP COLUMN"},
		{regexp.MustCompile(`\bDROP (?:INDEX|KEY|PRIMARY KEY)\b`), "DROP INDEX"},
		{regexp.MustCompile(`\bRENAME\b`), "RENAME"},
		{regexp.MustCompile(`\bALTER (?:COLUMN )?\S+ (?:SET DATA )?TYPE\b`), "ALTER COLUMN TYPE"},
		{regexp.MustCompile(`\b(?:MODIFY|CHANGE) (?:COLUMN )?\S+`), "MODIFY/CHANGE COLUMN"},
		{regexp.MustCompile(`^TRUNCATE\b`), "TRUNCATE"},
	}
)

// lintMigration returns the rules the migration breaks, one line each.
func lintMigration(dialect, sql string) []string {
	up := sql
	if m := reUpSection.FindStringSubmatch(sql); m != nil {
		up = m[1]
	}
	noTx := reNoTransaction.MatchString(sql)
	text := reLineComment.ReplaceAllString(up, "")
	created := map[string]bool{}
	var problems []string
	for _, stmt := range strings.Split(text, ";") {
		stmt = strings.TrimSpace(reSpaces.ReplaceAllString(stmt, " "))
		if stmt == "" {
			continue
		}
		upper := strings.ToUpper(stmt)
		short := stmt
		if len(short) > 80 {
			short = short[:80] + "..."
		}
		if m := reCreateTable.FindStringSubmatch(upper); m != nil {
			created[m[1]] = true
			continue
		}
		for _, d := range reDestructive {
			if d.re.MatchString(upper) {
				problems = append(problems, d.what+" (destructive; wait one release): "+short)
				break
			}
		}
		if m := reCreateIndex.FindStringSubmatch(upper); m != nil && !created[m[2]] {
			switch dialect {
			case "postgres":
				if m[1] == "" {
					problems = append(problems, "index on an existing table without CONCURRENTLY: "+short)
				} else if !noTx {
					problems = append(problems, "CREATE INDEX CONCURRENTLY outside a -- +goose NO TRANSACTION file: "+short)
				}
			case "mysql":
				if !reOnline.MatchString(upper) || !reNoLock.MatchString(upper) {
					problems = append(problems, "index on an existing table without ALGORITHM=INPLACE, LOCK=NONE: "+short)
				}
			}
		}
		if m := reAlterTable.FindStringSubmatch(upper); m != nil && !created[m[1]] && reAddIndex.MatchString(upper) {
			switch dialect {
			case "postgres":
				if !reUsingIndex.MatchString(upper) {
					problems = append(problems, "ALTER TABLE ... ADD a unique/primary key builds its index under a write lock "+
						"(build it CONCURRENTLY, then ADD CONSTRAINT ... USING INDEX): "+short)
				}
			case "mysql":
				if !reOnline.MatchString(upper) || !reNoLock.MatchString(upper) {
					problems = append(problems, "ADD INDEX on an existing table without ALGORITHM=INPLACE, LOCK=NONE: "+short)
				}
			}
		}
	}
	return problems
}

// TestMigrationsExpandOnlineOnly reads every embedded migration of both
// dialects and fails on any that breaks the rules and is not history.
func TestMigrationsExpandOnlineOnly(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range []struct {
		dialect string
		fsys    fs.FS
	}{{"postgres", postgresMigrations}, {"mysql", mysqlMigrations}} {
		files, err := fs.Glob(d.fsys, "migrations/"+d.dialect+"/*.sql")
		if err != nil || len(files) == 0 {
			t.Fatalf("%s migrations: %v (%d files)", d.dialect, err, len(files))
		}
		sort.Strings(files)
		for _, f := range files {
			b, err := fs.ReadFile(d.fsys, f)
			if err != nil {
				t.Fatal(err)
			}
			name := d.dialect + "/" + path.Base(f)
			problems := lintMigration(d.dialect, string(b))
			if _, ok := migrationHistory[name]; ok {
				seen[name] = true
				if len(problems) == 0 {
					t.Errorf("%s is allow-listed as history but breaks no rule: take it off migrationHistory", name)
				}
				continue
			}
			for _, p := range problems {
				t.Errorf("%s: %s (see docs/releasing.md, Migrations)", name, p)
			}
		}
	}
	for name := range migrationHistory {
		if !seen[name] {
			t.Errorf("migrationHistory names %s, which is not an embedded migration", name)
		}
	}
}

// TestLintMigration shows the lint catches what it is for (and passes what
// is allowed), on inline SQL rather than committed bad files.
func TestLintMigration(t *testing.T) {
	tests := []struct {
		name, dialect, sql string
		want               []string // the start of each problem, in order
	}{
		{"pg plain index on existing table", "postgres",
			"-- +goose Up\nCREATE INDEX orders_x_idx ON orders (sku_id);\n",
			[]string{"index on an existing table without CONCURRENTLY"}},
		{"pg unique index on existing table", "postgres",
			"-- +goose Up\nCREATE UNIQUE INDEX orders_x_idx ON orders (sku_id, user_id) WHERE x IS NOT NULL;\n",
			[]string{"index on an existing table without CONCURRENTLY"}},
		{"pg concurrently inside a transaction", "postgres",
			"-- +goose Up\nCREATE INDEX CONCURRENTLY orders_x_idx ON orders (sku_id);\n",
			[]string{"CREATE INDEX CONCURRENTLY outside a -- +goose NO TRANSACTION file"}},
		{"pg concurrently, no transaction", "postgres",
			"-- +goose NO TRANSACTION\n-- +goose Up\nCREATE INDEX CONCURRENTLY IF NOT EXISTS orders_x_idx ON orders (sku_id);\n-- +goose Down\nDROP INDEX CONCURRENTLY orders_x_idx;\n",
			nil},
		{"pg index on a table of the same file", "postgres",
			"-- +goose Up\nCREATE TABLE t (id bigint PRIMARY KEY, v text);\nCREATE INDEX t_v_idx ON t (v);\n",
			nil},
		{"pg the 00009 pattern", "postgres",
			"-- +goose Up\nDROP INDEX orders_idempotency_idx;\nCREATE UNIQUE INDEX orders_idempotency_idx ON orders (sku_id, user_id, idempotency_key);\n",
			[]string{"DROP INDEX", "index on an existing table without CONCURRENTLY"}},
		{"pg add unique constraint", "postgres",
			"-- +goose Up\nALTER TABLE orders ADD CONSTRAINT orders_u UNIQUE (sku_id, user_id);\n",
			[]string{"ALTER TABLE ... ADD a unique/primary key"}},
		{"pg unique constraint using a built index", "postgres",
			"-- +goose Up\nALTER TABLE orders ADD CONSTRAINT orders_u UNIQUE USING INDEX orders_u_idx;\n",
			nil},
		{"pg drop column", "postgres",
			"-- +goose Up\nALTER TABLE orders DROP COLUMN payment_ref;\n",
			[]string{"DROP COLUMN"}},
		{"pg drop column without the keyword", "postgres",
			"-- +goose Up\nALTER TABLE orders DROP payment_ref;\n",
			[]string{"DROP COLUMN"}},
		{"pg drop table", "postgres",
			"-- +goose Up\nDROP TABLE IF EXISTS cancel_requests;\n",
			[]string{"DROP TABLE"}},
		{"pg rename column", "postgres",
			"-- +goose Up\nALTER TABLE orders RENAME COLUMN payment_ref TO payment_reference;\n",
			[]string{"RENAME"}},
		{"pg change type", "postgres",
			"-- +goose Up\nALTER TABLE orders ALTER COLUMN quantity TYPE integer;\n",
			[]string{"ALTER COLUMN TYPE"}},
		{"pg add a nullable column", "postgres",
			"-- +goose Up\nALTER TABLE orders ADD COLUMN note text NULL;\n-- +goose Down\nALTER TABLE orders DROP COLUMN note;\n",
			nil},
		{"pg a comment that mentions DROP TABLE", "postgres",
			"-- never DROP TABLE orders here\n-- +goose Up\nALTER TABLE orders ADD COLUMN note text NULL;\n",
			nil},
		{"mysql add index without online DDL", "mysql",
			"-- +goose Up\nALTER TABLE orders ADD INDEX orders_x_idx (sku_id);\n",
			[]string{"ADD INDEX on an existing table without ALGORITHM=INPLACE, LOCK=NONE"}},
		{"mysql add index, inplace but locking", "mysql",
			"-- +goose Up\nALTER TABLE orders ADD INDEX orders_x_idx (sku_id), ALGORITHM=INPLACE;\n",
			[]string{"ADD INDEX on an existing table without ALGORITHM=INPLACE, LOCK=NONE"}},
		{"mysql add unique key online", "mysql",
			"-- +goose Up\nALTER TABLE orders ADD UNIQUE KEY orders_x_idx (sku_id, user_id), ALGORITHM=INPLACE, LOCK=NONE;\n",
			nil},
		{"mysql create index without online DDL", "mysql",
			"-- +goose Up\nCREATE INDEX orders_x_idx ON orders (sku_id);\n",
			[]string{"index on an existing table without ALGORITHM=INPLACE, LOCK=NONE"}},
		{"mysql create index online", "mysql",
			"-- +goose Up\nCREATE INDEX orders_x_idx ON orders (sku_id) ALGORITHM=INPLACE LOCK=NONE;\n",
			nil},
		{"mysql the 00002 pattern", "mysql",
			"-- +goose Up\nALTER TABLE orders DROP KEY orders_idempotency_idx,\n    ADD UNIQUE KEY orders_idempotency_idx (sku_id, user_id, idempotency_key);\n",
			[]string{"DROP INDEX", "ADD INDEX on an existing table without ALGORITHM=INPLACE, LOCK=NONE"}},
		{"mysql modify column", "mysql",
			"-- +goose Up\nALTER TABLE orders MODIFY COLUMN quantity INT NOT NULL;\n",
			[]string{"MODIFY/CHANGE COLUMN"}},
		{"mysql rename table", "mysql",
			"-- +goose Up\nRENAME TABLE orders TO orders_old;\n",
			[]string{"RENAME"}},
		{"mysql add column", "mysql",
			"-- +goose Up\nALTER TABLE inventory ADD COLUMN note VARCHAR(64) NULL;\n",
			nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := lintMigration(tt.dialect, tt.sql)
			var starts []string
			for i, p := range got {
				if i < len(tt.want) && strings.HasPrefix(p, tt.want[i]) {
					starts = append(starts, tt.want[i])
				} else {
					starts = append(starts, p)
				}
			}
			if diff := cmp.Diff(tt.want, starts); diff != "" {
				t.Errorf("lintMigration problems (-want +got):\n%s", diff)
			}
		})
	}
}
