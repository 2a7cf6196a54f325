package reconcile_test

import (
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestClaimPrefix: the first deployment on a Redis prefix owns it, and
// every instance of its database may claim it again; a second deployment
// (another database) on that prefix is refused with a message naming the
// prefix and both; a prefix whose owner key was lost is claimed afresh.
func TestClaimPrefix(t *testing.T) {
	ctx := t.Context()
	open := func(url string) *orderstore.Store {
		st, err := orderstore.Open(ctx, url, orderstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return st
	}
	urlA := testenv.Database(t)
	a, a2, b := open(urlA), open(urlA), open(testenv.Database(t))
	id := func(st *orderstore.Store) string {
		id, err := st.DeploymentID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	redisURL, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, redisURL)
	g := stockgate.New(c, prefix)
	owner := func() string {
		v, err := c.Do(ctx, c.B().Get().Key(prefix+":owner").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	for i, st := range []*orderstore.Store{a, a, a2} { // again, and another instance
		if err := reconcile.ClaimPrefix(ctx, st, g); err != nil {
			t.Fatalf("claim %d by the first deployment: %v", i, err)
		}
	}
	wantOwner := id(a) + " " + a.Describe()
	if got := owner(); got != wantOwner {
		t.Fatalf("owner %q, want %q", got, wantOwner)
	}

	err := reconcile.ClaimPrefix(ctx, b, g)
	if err == nil {
		t.Fatal("a second deployment claimed a prefix the first owns")
	}
	for _, want := range []string{prefix, id(a), a.Describe(), id(b), b.Describe(), "FLASHSALE_REDIS_PREFIX"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %q", err, want)
		}
	}
	if got := owner(); got != wantOwner {
		t.Fatalf("owner after the refusal %q, want %q", got, wantOwner)
	}

	// Redis lost the owner key: the next claim records its claimant.
	if err := c.Do(ctx, c.B().Del().Key(prefix+":owner").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := reconcile.ClaimPrefix(ctx, b, g); err != nil {
		t.Fatalf("claim of a prefix with no owner: %v", err)
	}
	if got, want := owner(), id(b)+" "+b.Describe(); got != want {
		t.Fatalf("owner %q, want %q", got, want)
	}
}

// TestClaimPrefixRefusesACopy: a database restored from another's dump (on
// the same server or another) carries the same deployment row; pointed at
// the original's Redis prefix it is refused, with a message that says what
// to do. A claim the previous release recorded (the owner key alone) still
// passes on its own database, which then records its identity.
func TestClaimPrefixRefusesACopy(t *testing.T) {
	ctx := t.Context()
	open := func(url string) *orderstore.Store {
		st, err := orderstore.Open(ctx, url, orderstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return st
	}
	urlA := testenv.Database(t)
	a, a2, cp := open(urlA), open(urlA), open(testenv.Database(t))
	idA, err := a.DeploymentID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The copy: the original's deployment row, as a restore writes it.
	if _, err := cp.DeploymentID(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.DB().ExecContext(ctx, cp.Rebind(`UPDATE deployment SET id = ? WHERE one = 1`), idA); err != nil {
		t.Fatal(err)
	}
	if id, err := cp.DeploymentID(ctx); err != nil || id != idA {
		t.Fatalf("copy's deployment id %q %v, want the original's %q", id, err, idA)
	}

	redisURL, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, redisURL)
	g := stockgate.New(c, prefix)
	// The previous release claimed the prefix: its owner key alone.
	if err := c.Do(ctx, c.B().Set().Key(prefix+":owner").Value(idA+" "+a.Describe()).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for i, st := range []*orderstore.Store{a, a2, a} {
		if err := reconcile.ClaimPrefix(ctx, st, g); err != nil {
			t.Fatalf("claim %d by the original database: %v", i, err)
		}
	}
	err = reconcile.ClaimPrefix(ctx, cp, g)
	if err == nil {
		t.Fatal("a copy of the original database (same deployment row) claimed the original's prefix")
	}
	for _, want := range []string{prefix, "FLASHSALE_REDIS_PREFIX", "DEL " + prefix + ":owner:database"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if err := reconcile.ClaimPrefix(ctx, a, g); err != nil {
		t.Fatalf("the original after the copy's refusal: %v", err)
	}
}
