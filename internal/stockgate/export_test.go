package stockgate

import (
	"context"
	"strconv"
	"time"
)

// TransferOut runs only the first half of a transfer (a caller that died
// after it), for tests. It returns the units moved.
func (g *Gate) TransferOut(ctx context.Context, from, to, toEpoch string, units int64, k int, at time.Time) (int64, error) {
	vals, err := xferOutScript.Exec(ctx, g.c, []string{g.KeysOf(from).Meta, g.xferKey(from)},
		[]string{newTransferID(), to, toEpoch, strconv.FormatInt(units, 10), strconv.Itoa(k), strconv.FormatInt(at.UnixMilli(), 10)}).AsIntSlice()
	if err != nil {
		return 0, err
	}
	return vals[0], nil
}

// SlotOf is slotOf, for tests.
func SlotOf(tag string) int { return slotOf(tag) }
