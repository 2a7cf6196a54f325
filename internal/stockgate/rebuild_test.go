package stockgate

import (
	"strings"
	"testing"
)

// TestRebuildKeysOneSlot: the run-id monitor's keys hash to the slot of
// the run id key (one script touches them all on a Redis Cluster), and sit
// under the prefix.
func TestRebuildKeysOneSlot(t *testing.T) {
	for _, prefix := range []string{"fs", "a:b", "{fs}", "x{y}z", "odd{"} {
		g := &Gate{prefix: prefix}
		ks := g.rebuildKeys()
		for _, k := range ks {
			if !strings.HasPrefix(k, prefix) && !strings.Contains(prefix, "{") {
				t.Errorf("prefix %q: key %q not under it", prefix, k)
			}
		}
		want := keySlot(ks[0])
		for _, k := range ks[1:] {
			if got := keySlot(k); got != want {
				t.Errorf("prefix %q: key %q in slot %d, the run id key %q in %d", prefix, k, got, ks[0], want)
			}
		}
	}
}

// keySlot is Redis Cluster's slot of key: of its hash tag, if it has one.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return slotOf(key[i+1 : i+1+j])
		}
	}
	return slotOf(key)
}
