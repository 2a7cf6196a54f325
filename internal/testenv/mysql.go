package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// DefaultMySQLURL is the server MySQL uses when FLASHSALE_TEST_MYSQL_URL is unset.
const DefaultMySQLURL = "mysql://root@127.0.0.1:3306/test"

// Dialect is the database the integration tests run on: "mysql" when
// FLASHSALE_TEST_DIALECT is mysql (or mariadb), "postgres" otherwise. CI runs
// the suite once for each.
func Dialect() string {
	switch os.Getenv("FLASHSALE_TEST_DIALECT") {
	case "mysql", "mariadb":
		return "mysql"
	}
	return "postgres"
}

// Database creates a fresh, empty database of the dialect under test (see
// Dialect) and returns its URL: Postgres or MySQL.
func Database(t testing.TB) string {
	t.Helper()
	if Dialect() == "mysql" {
		return MySQL(t)
	}
	return Postgres(t)
}

// MySQL creates a fresh, empty database on the MySQL/MariaDB test server
// (FLASHSALE_TEST_MYSQL_URL, default DefaultMySQLURL) and returns its
// mysql:// URL. The database is dropped when the test ends. An unreachable
// server makes the test skip (or fail, see Required).
func MySQL(t testing.TB) string {
	t.Helper()
	base := getenv("FLASHSALE_TEST_MYSQL_URL", DefaultMySQLURL)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: FLASHSALE_TEST_MYSQL_URL: %v", err)
	}
	name := RandomName("flashsale_t_")
	db, err := adminMySQL(u)
	if err != nil {
		t.Fatalf("testenv: FLASHSALE_TEST_MYSQL_URL: %v", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		Unavailable(t, "mysql", fmt.Errorf("create database %s: %w", name, err))
	}
	t.Cleanup(func() {
		db, err := adminMySQL(u)
		if err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	out := *u
	out.Path = "/" + name
	out.RawPath = ""
	return out.String()
}

// adminMySQL connects to the server of u without a database.
func adminMySQL(u *url.URL) (*sql.DB, error) {
	cfg := mysql.NewConfig()
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr += ":3306"
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}
