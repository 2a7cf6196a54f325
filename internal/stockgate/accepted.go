package stockgate

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// The accepted index (KEYS "accepted" below) lists, scored by acceptance
// time, the reservations the stream acknowledged that the database has not
// decided yet; with the outbox (not yet acknowledged) it covers every
// reservation in flight, so the oldest one is read from two first elements.
var (
	//go:embed unqueue.lua
	unqueueLua string
	//go:embed index.lua
	indexLua string
	//go:embed stuck.lua
	stuckLua string
	//go:embed oldest.lua
	oldestLua string

	unqueueScript = rueidis.NewLuaScript(unqueueLua)
	indexScript   = rueidis.NewLuaScript(indexLua)
	stuckScript   = rueidis.NewLuaScript(stuckLua)
	oldestScript  = rueidis.NewLuaScript(oldestLua)
)

// acceptedKey names sku's accepted index.
func (g *Gate) acceptedKey(sku string) string { return g.prefix + ":{" + sku + "}:accepted" }

// Unqueue removes outbox entries of sku once the stream has acknowledged
// them; those still in flight move to the accepted index with their
// acceptance time.
func (g *Gate) Unqueue(ctx context.Context, sku string, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	k := g.KeysOf(sku)
	if err := unqueueScript.Exec(ctx, g.c, []string{k.Res, k.Outbox, g.acceptedKey(sku)}, ids).Error(); err != nil {
		return fmt.Errorf("stockgate: unqueue: %w", err)
	}
	return nil
}

// Stuck is a reservation the stream acknowledged that is still in flight.
type Stuck struct {
	OrderID    string
	Payload    []byte
	AcceptedAt time.Time
}

// Stuck returns up to limit reservations of sku acknowledged by the stream
// and still in flight that were accepted at or before before, oldest first,
// skipping the first offset of them. Index entries of closed reservations
// are dropped on the way (so a page may hold fewer than limit).
func (g *Gate) Stuck(ctx context.Context, sku string, before time.Time, offset, limit int) ([]Stuck, error) {
	k := g.KeysOf(sku)
	vals, err := stuckScript.Exec(ctx, g.c, []string{k.Res, g.acceptedKey(sku)},
		[]string{strconv.FormatInt(before.UnixMilli(), 10), strconv.Itoa(offset), strconv.Itoa(limit)}).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("stockgate: stuck: %w", err)
	}
	out := make([]Stuck, 0, len(vals)/3)
	for i := 0; i+2 < len(vals); i += 3 {
		ms, _ := strconv.ParseInt(vals[i+2], 10, 64)
		out = append(out, Stuck{OrderID: vals[i], Payload: []byte(vals[i+1]), AcceptedAt: time.UnixMilli(ms)})
	}
	return out, nil
}

// IndexInFlight reads one page of sku's in-flight entries (HSCAN from
// cursor, about count of them) and adds those that neither the outbox nor the
// accepted index holds (re-recorded by a rebuild, or accepted by an older
// version) to the index. It returns the next cursor (0: the scan is complete)
// and how many were added.
func (g *Gate) IndexInFlight(ctx context.Context, sku string, cursor uint64, count int) (next uint64, added int, err error) {
	k := g.KeysOf(sku)
	e, err := g.c.Do(ctx, g.c.B().Hscan().Key(k.Res).Cursor(cursor).Count(int64(count)).Build()).AsScanEntry()
	if err != nil {
		return 0, 0, fmt.Errorf("stockgate: scan in-flight: %w", err)
	}
	var args []string
	for i := 0; i+1 < len(e.Elements); i += 2 {
		var r struct {
			AcceptedAt int64 `json:"accepted_at"`
		}
		if json.Unmarshal([]byte(e.Elements[i+1]), &r) != nil || r.AcceptedAt <= 0 {
			continue
		}
		args = append(args, e.Elements[i], strconv.FormatInt(r.AcceptedAt, 10))
	}
	if len(args) > 0 {
		n, err := indexScript.Exec(ctx, g.c, []string{k.Res, k.Outbox, g.acceptedKey(sku)}, args).AsInt64()
		if err != nil {
			return 0, 0, fmt.Errorf("stockgate: index in-flight: %w", err)
		}
		added = int(n)
	}
	return e.Cursor, added, nil
}

// OldestInFlight returns the acceptance time of sku's oldest reservation in
// flight, and false when none is. Cheap: two first elements of sorted sets.
func (g *Gate) OldestInFlight(ctx context.Context, sku string) (time.Time, bool, error) {
	k := g.KeysOf(sku)
	ms, err := oldestScript.Exec(ctx, g.c, []string{k.Res, k.Outbox, g.acceptedKey(sku)}, nil).AsInt64()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("stockgate: oldest in flight: %w", err)
	}
	if ms < 0 {
		return time.Time{}, false, nil
	}
	return time.UnixMilli(ms), true, nil
}
