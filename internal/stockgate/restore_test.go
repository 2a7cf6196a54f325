package stockgate

import (
	"context"
	"errors"
	"testing"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/testenv"
)

func newInternalGate(t *testing.T) *Gate {
	t.Helper()
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	return New(c, prefix)
}

// TestRestoreBadQuantitySpendsNoToken: a restore refused for its quantity
// writes nothing, not even its token, so the corrected call for the same
// order id still applies. Checked both through Restore (Go validation) and
// by calling restore.lua directly (its own validation, before any write).
func TestRestoreBadQuantitySpendsNoToken(t *testing.T) {
	g := newInternalGate(t)
	ctx := context.Background()
	if ok, err := g.Seed(ctx, "s", Config{PerUserLimit: 5}, 10, map[string]int64{"ann": 2}, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := g.Restore(ctx, "s", []Release{{OrderID: "o1", User: "ann", Quantity: 0}}); !errors.Is(err, sale.ErrInvalid) {
		t.Fatalf("restore of 0 units: %v, want sale.ErrInvalid", err)
	}
	k := g.KeysOf("s")
	for _, bad := range [][]string{
		{"o1", "ann", "x"},
		{"o1", "ann", "1.5"},
		{"o1", "ann", "0"},
		{"o2", "ann", "1", "o1", "ann", ""}, // a bad triple after a good one: the good one is not applied either
		{"o1", "ann"},                       // not a triple
	} {
		bad = append([]string{"0"}, bad...) // no key pairs
		if err := g.restore.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Rel, k.Idem}, bad).Error(); err == nil {
			t.Fatalf("restore.lua %q: no error", bad)
		}
	}
	for _, bad := range [][]string{
		{"x", "o1", "ann", "1"},
		{"-1", "o1", "ann", "1"},
		{"2", "ann\x00k", "o1", "o1", "ann", "1"}, // fewer pairs than said
		{"1", "ann\x00k", "o1", "o1", "ann"},      // a pair, then not a triple
	} {
		if err := g.restore.Exec(ctx, g.c, []string{k.Meta, k.Buyers, k.Rel, k.Idem}, bad).Error(); err == nil {
			t.Fatalf("restore.lua %q: no error", bad)
		}
	}
	if n, err := g.c.Do(ctx, g.c.B().Scard().Key(k.Rel).Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("rel holds %d tokens after refused calls (%v), want 0", n, err)
	}
	units, err := g.Restore(ctx, "s", []Release{{OrderID: "o1", User: "ann", Quantity: 2}})
	if err != nil || units != 2 {
		t.Fatalf("restore after refused ones: %d units, %v; want 2", units, err)
	}
	if n, _, _ := g.Available(ctx, "s"); n != 12 {
		t.Fatalf("available %d, want 12", n)
	}
	if h, _ := g.Held(ctx, "s", "ann"); h != 0 {
		t.Fatalf("ann holds %d, want 0", h)
	}
}
