package orderstore

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
)

// WithDatabase returns the database URL dbURL naming database name instead
// (a keyword/value PostgreSQL DSN gets a dbname keyword: the last one wins).
func WithDatabase(dbURL, name string) (string, error) {
	if !strings.Contains(dbURL, "://") {
		return strings.TrimSpace(dbURL) + " dbname=" + name, nil
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("database url: %w", err)
	}
	u.Path, u.RawPath = "/"+name, ""
	return u.String(), nil
}

// DropDatabase drops the database named in dbURL, with any sessions still
// on it (PostgreSQL: through the server's "postgres" maintenance database).
// For scratch databases (the bench's per-strategy databases).
func DropDatabase(ctx context.Context, dbURL string) error {
	if DialectOf(dbURL) == MySQL {
		cfg, err := mysqlConfig(dbURL)
		if err != nil {
			return err
		}
		return onMySQLServer(ctx, cfg, "DROP DATABASE IF EXISTS "+quoteMySQL(cfg.DBName))
	}
	cc, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	name := cc.Database
	cc.Database = maintenanceDB
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}
