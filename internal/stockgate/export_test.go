package stockgate

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// AfterSeedChunk makes Seed call f after each chunk but the last, for the
// test's duration.
func AfterSeedChunk(t *testing.T, f func(i int)) {
	afterSeedChunk = f
	t.Cleanup(func() { afterSeedChunk = nil })
}

// TransferOut runs only the first half of a transfer (a caller that died
// after it), for tests. It returns the units moved.
func (g *Gate) TransferOut(ctx context.Context, from, to, toEpoch string, units int64, k int, at time.Time) (int64, error) {
	n, _, err := g.TransferOutID(ctx, from, to, toEpoch, units, k, at)
	return n, err
}

// TransferOutID is TransferOut, also returning the transfer id.
func (g *Gate) TransferOutID(ctx context.Context, from, to, toEpoch string, units int64, k int, at time.Time) (int64, string, error) {
	id := newTransferID()
	vals, err := xferOutScript.lua.Exec(ctx, g.c, []string{g.KeysOf(from).Meta, g.xferKey(from)},
		[]string{id, to, toEpoch, strconv.FormatInt(units, 10), strconv.Itoa(k), strconv.FormatInt(at.UnixMilli(), 10)}).AsIntSlice()
	if err != nil {
		return 0, "", err
	}
	return vals[0], id, nil
}

// CompleteTransfer runs the second half of a transfer (a caller that read
// the entry before a rebuild and goes on after it), for tests.
func (g *Gate) CompleteTransfer(ctx context.Context, from, id, to, toEpoch string, units int64) error {
	return g.completeTransfer(ctx, from, id, to, toEpoch, units)
}

// Transfer is transfer (both halves, durable where replicas exist), for
// tests.
func (g *Gate) Transfer(ctx context.Context, from, to, toEpoch string, units int64, k int) error {
	return g.transfer(ctx, from, to, toEpoch, units, k)
}

// AfterTransferOut makes a transfer call f between its halves, for the
// test's duration.
func AfterTransferOut(t *testing.T, f func()) {
	afterTransferOut = f
	t.Cleanup(func() { afterTransferOut = nil })
}

// SetTryAgainFor sets how long the gate retries TRYAGAIN for the test's
// duration. Only for a test that does not run in parallel.
func SetTryAgainFor(t *testing.T, d time.Duration) {
	old := tryAgainFor
	tryAgainFor = d
	t.Cleanup(func() { tryAgainFor = old })
}

// ReserveLua is the reserve script's source (BenchmarkReserveBatched).
var ReserveLua = reserveLua

// ReserveScript is the reserve script as the gate runs it.
func (g *Gate) ReserveScript() *rueidis.Lua { return g.reserve }

// LimitKeys are the rate-limit keys of a reserve of user from ipKey.
func (g *Gate) LimitKeys(sku, user, ipKey string) [3]string { return g.limitKeys(sku, user, ipKey) }

// Args are r's script arguments: emission interval µs and burst.
func (r Rate) Args() (string, string) { return r.args() }
