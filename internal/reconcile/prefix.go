package reconcile

import (
	"context"
	"fmt"
	"strings"
)

// Deployment is the database's identity (orderstore.Store).
type Deployment interface {
	// DeploymentID returns the database's deployment id, made on first use.
	DeploymentID(ctx context.Context) (string, error)
	// Describe names the database ("<dialect> <host>/<database>").
	Describe() string
	// DatabaseIdentity names the database itself, which a copy holding
	// the same deployment row does not share.
	DatabaseIdentity(ctx context.Context) (string, error)
}

// PrefixGate records who owns the gate's Redis key prefix (stockgate.Gate).
type PrefixGate interface {
	// ClaimPrefix records owner if the prefix has none, and returns the
	// owner recorded.
	ClaimPrefix(ctx context.Context, owner string) (string, error)
	// ClaimDatabase records identity as the database of deployment id
	// unless one of id's is recorded, and returns the one recorded.
	ClaimDatabase(ctx context.Context, id, identity string) (string, error)
	// DatabaseKey names the key ClaimDatabase records.
	DatabaseKey() string
	Prefix() string
}

// ClaimPrefix makes sure the gate's Redis prefix belongs to db: it records
// db's deployment id (followed by db.Describe()) under <prefix>:owner and
// db's own identity (db.DatabaseIdentity) beside it if no one has (a new
// Redis, or one that lost its keys; the identity also where the previous
// release claimed without it), and returns nil if both recorded are db's,
// whichever instance of it claimed. A prefix another deployment owns is
// refused with an error naming the prefix, the owner recorded and db: two
// deployments on one prefix would publish each other's reservations to
// their own streams and databases. So is a copy of the owner's database (a
// dump or snapshot restored elsewhere carries the deployment row), with an
// error that says how to hand the prefix over when the copy has
// deliberately taken the original's place. Call it before anything reads
// or writes under the prefix, and again before a rebuild (a Redis that
// lost its keys lost its owner keys too). Idempotent.
func ClaimPrefix(ctx context.Context, db Deployment, gate PrefixGate) error {
	id, err := db.DeploymentID(ctx)
	if err != nil {
		return err
	}
	mine := id + " " + db.Describe()
	owner, err := gate.ClaimPrefix(ctx, mine)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if ownerID, _, _ := strings.Cut(owner, " "); ownerID != id {
		return fmt.Errorf("redis prefix %q belongs to another deployment: owner %q, this database is %q; "+
			"give each deployment its own FLASHSALE_REDIS_PREFIX (or Redis)", gate.Prefix(), owner, mine)
	}
	ident, err := db.DatabaseIdentity(ctx)
	if err != nil {
		return err
	}
	recorded, err := gate.ClaimDatabase(ctx, id, ident)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if recorded != ident {
		return fmt.Errorf("redis prefix %q belongs to deployment %s on database %q, and this database (%q, %s) is a copy of it "+
			"holding the same deployment row (a restored dump or snapshot): give this copy its own FLASHSALE_REDIS_PREFIX (or Redis). "+
			"If this database has deliberately taken the original's place (a restore or upgrade into a new server, a failover to a MySQL or MariaDB replica) "+
			"and no instance of the original runs, hand the prefix over: redis-cli DEL %s",
			gate.Prefix(), id, recorded, ident, db.Describe(), gate.DatabaseKey())
	}
	return nil
}
