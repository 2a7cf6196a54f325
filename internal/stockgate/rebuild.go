package stockgate

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

//go:embed rebuild.lua
var rebuildLua string

var rebuildScript = rueidis.NewLuaScript(rebuildLua)

// The run-id monitor's record (reconcile.Monitor) is three keys: the run id
// the sales were last loaded for (<prefix>:runid, SwapRunID's), the run id
// a rebuild is still pending for, and the lease of the instance doing it.
// The pending mark outlives a rebuild that failed, was cancelled or whose
// instance crashed, so that some instance finishes it; the lease keeps the
// others from rebuilding the same sales at the same time.

func (g *Gate) runIDKey() string { return g.prefix + ":runid" }

// rebuildKeys returns the keys of rebuild.lua: the run id key, and the
// pending and lease keys in its Redis Cluster slot, under the prefix (so
// that a look at the prefix's keys finds them): the run id key's own hash
// tag if it has one, else the run id key as their tag.
func (g *Gate) rebuildKeys() []string {
	k := g.runIDKey()
	base := k
	switch {
	case hasHashTag(k):
	case strings.Contains(k, "}"):
		// No tag can name a slot by a key holding '}': such a prefix
		// works on a single server only (a Redis Cluster answers CROSSSLOT).
	case strings.Contains(k, "{"):
		base = "{" + k + "}" // a '{' of the prefix would open the tag
	default:
		base = g.prefix + ":{" + k + "}"
	}
	return []string{k, base + ":rebuild", base + ":rebuilding"}
}

// hasHashTag reports whether Redis Cluster hashes key by a tag: a '{'
// followed, later, by a '}' with at least one byte between.
func hasHashTag(key string) bool {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return false
	}
	j := strings.IndexByte(key[i+1:], '}')
	return j > 0
}

// MarkRunID records id as the run id the sales are loaded for, if another
// one (or none) is recorded, and then, in the same step, marks a rebuild
// pending for id and gives its lease to token for lease. It returns the
// run id recorded before and whether it marked: of several instances
// noticing the same restart, exactly one marks.
func (g *Gate) MarkRunID(ctx context.Context, id, token string, lease time.Duration) (prev string, marked bool, err error) {
	vals, err := rebuildScript.Exec(ctx, g.c, g.rebuildKeys(), []string{"mark", id, token, leaseMs(lease)}).ToArray()
	if err != nil {
		return "", false, fmt.Errorf("stockgate: mark run id: %w", err)
	}
	prev, _ = vals[0].ToString()
	n, _ := vals[1].AsInt64()
	return prev, n == 1, nil
}

// ClaimRebuild returns the run id a rebuild is pending for ("" if none) and
// whether token holds its lease now: taken because it was free (its holder
// finished without success, or crashed and the lease ran out) or renewed
// for lease because token held it.
func (g *Gate) ClaimRebuild(ctx context.Context, token string, lease time.Duration) (pending string, held bool, err error) {
	vals, err := rebuildScript.Exec(ctx, g.c, g.rebuildKeys(), []string{"claim", token, leaseMs(lease)}).ToArray()
	if err != nil {
		return "", false, fmt.Errorf("stockgate: claim rebuild: %w", err)
	}
	pending, _ = vals[0].ToString()
	n, _ := vals[1].AsInt64()
	return pending, n == 1, nil
}

// EndRebuild frees token's lease and, when the rebuild for run id id
// succeeded, clears the pending mark if it still names id (a restart
// noticed meanwhile marked a newer one, which stays).
func (g *Gate) EndRebuild(ctx context.Context, id, token string, succeeded bool) error {
	ok := "0"
	if succeeded {
		ok = "1"
	}
	if err := rebuildScript.Exec(ctx, g.c, g.rebuildKeys(), []string{"end", id, token, ok}).Error(); err != nil {
		return fmt.Errorf("stockgate: end rebuild: %w", err)
	}
	return nil
}

func leaseMs(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }
