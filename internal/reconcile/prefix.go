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
}

// PrefixGate records who owns the gate's Redis key prefix (stockgate.Gate).
type PrefixGate interface {
	// ClaimPrefix records owner if the prefix has none, and returns the
	// owner recorded.
	ClaimPrefix(ctx context.Context, owner string) (string, error)
	Prefix() string
}

// ClaimPrefix makes sure the gate's Redis prefix belongs to db: it records
// db's deployment id (followed by db.Describe()) under <prefix>:owner if no
// one has (a new Redis, or one that lost its keys), and returns nil if the
// owner recorded is db, whichever instance of it claimed. A prefix another
// deployment owns is refused with an error naming the prefix, the owner
// recorded and db: two deployments on one prefix would publish each
// other's reservations to their own streams and databases. Call it before
// anything reads or writes under the prefix, and again before a rebuild
// (a Redis that lost its keys lost its owner key too). Idempotent.
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
	return nil
}
