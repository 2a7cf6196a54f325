package orderstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
)

// The deployment table holds one row: the identity of this database, a
// random id made at its first start. The Redis prefix a deployment uses is
// claimed with it, so that two deployments on different databases can never
// share one prefix (each would work the other's outboxes).
const (
	createDeploymentSQL = `CREATE TABLE IF NOT EXISTS deployment (
    one        SMALLINT    NOT NULL PRIMARY KEY CHECK (one = 1),
    id         VARCHAR(64) NOT NULL
)`
	insertDeploymentPostgresSQL = `INSERT INTO deployment (one, id) VALUES (1, $1) ON CONFLICT DO NOTHING`
	insertDeploymentMySQLSQL    = `INSERT IGNORE INTO deployment (one, id) VALUES (1, ?)`
	selectDeploymentSQL         = `SELECT id FROM deployment WHERE one = 1`
)

// DeploymentID returns the identity of this database: a random id made
// the first time any instance asked for it, the same ever after for every
// instance on this database (several may ask at once).
func (s *Store) DeploymentID(ctx context.Context) (string, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	ins := insertDeploymentPostgresSQL
	if s.dialect == MySQL {
		ins = insertDeploymentMySQLSQL
	}
	var err error
	for range 3 { // concurrent first starts may race on CREATE TABLE IF NOT EXISTS
		if _, err = s.DB().ExecContext(ctx, createDeploymentSQL); err != nil {
			continue
		}
		if _, err = s.DB().ExecContext(ctx, ins, hex.EncodeToString(b[:])); err != nil {
			continue
		}
		var id string
		if err = s.DB().QueryRowContext(ctx, selectDeploymentSQL).Scan(&id); err == nil {
			return id, nil
		}
	}
	return "", fmt.Errorf("orderstore: deployment id: %w", err)
}

// Describe names the database for people: dialect, host and database name,
// never the password.
func (s *Store) Describe() string { return s.desc }

// describe returns "<dialect> <host>/<database>" for a database URL or a
// PostgreSQL keyword/value DSN.
func describe(d Dialect, dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		return fmt.Sprintf("%s %s/%s", d, u.Host, strings.TrimPrefix(u.Path, "/"))
	}
	kv := map[string]string{}
	for _, f := range strings.Fields(dsn) {
		if k, v, ok := strings.Cut(f, "="); ok {
			kv[k] = strings.Trim(v, "'")
		}
	}
	host := kv["host"]
	if kv["port"] != "" {
		host += ":" + kv["port"]
	}
	return fmt.Sprintf("%s %s/%s", d, host, kv["dbname"])
}

// The database's own identity, which a copy does not carry: a dump
// restored elsewhere, or beside the original, brings the deployment row
// along but runs on another server or under another name.
const (
	// The cluster's system identifier is drawn by initdb and kept by its
	// physical standbys (a failover keeps it); a restore of a dump (pg_dump,
	// or pg_upgrade's new cluster) has its own.
	identityPostgresSQL = `SELECT (SELECT system_identifier FROM pg_control_system())::text || '/' || current_database()`
	// MySQL's server_uuid is drawn at the server's first start; MariaDB has
	// none, and its server id, host name and port stand in. A replica has
	// its own of each: a failover to it is a new identity (see
	// reconcile.ClaimPrefix for the hand-over).
	identityMySQLUUIDSQL = `SELECT CONCAT(@@server_uuid, '/', DATABASE())`
	identityMariaDBSQL   = `SELECT CONCAT('server_id=', @@server_id, '@', @@hostname, ':', @@port, '/', DATABASE())`

	myUnknownSystemVariable = 1193 // ER_UNKNOWN_SYSTEM_VARIABLE
)

// DatabaseIdentity names the database itself, apart from the deployment
// row it holds: "<dialect> <server>/<database>", with PostgreSQL's system
// identifier, MySQL's server uuid or, on MariaDB, its server id, host name
// and port as the server. A copy of the database (restored from a dump on
// another server, or beside the original under another name) has the same
// DeploymentID and another identity.
func (s *Store) DatabaseIdentity(ctx context.Context) (string, error) {
	var id string
	var err error
	if s.dialect == MySQL {
		// MariaDB answers "Unknown system variable 'server_uuid'" (1193);
		// any other error must not switch a MySQL to the other form.
		if err = s.DB().QueryRowContext(ctx, identityMySQLUUIDSQL).Scan(&id); mysqlCode(err) == myUnknownSystemVariable {
			err = s.DB().QueryRowContext(ctx, identityMariaDBSQL).Scan(&id)
		}
	} else {
		err = s.DB().QueryRowContext(ctx, identityPostgresSQL).Scan(&id)
	}
	if err != nil {
		return "", fmt.Errorf("orderstore: database identity: %w", err)
	}
	return string(s.dialect) + " " + id, nil
}
