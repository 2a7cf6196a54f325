package stockgate

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCheckPlacement(t *testing.T) {
	even := []SlotRange{{0, 5460, "a:1", "A"}, {5461, 10922, "b:1", "B"}, {10923, 16383, "c:1", "C"}}
	for _, k := range []int{1, 2, 3, 6} {
		if pc := CheckPlacement(even, "hot", k); !pc.OK() || len(pc.Placements) != k {
			t.Errorf("k=%d on three even primaries: %+v", k, pc)
		}
	}
	if pc := CheckPlacement(even, "hot", 4); pc.Allowed != 2 || !pc.OK() {
		t.Errorf("k=4 on three primaries: %+v, want at most 2 each and ok", pc)
	}
	// Three primaries, but every slot save two on a: b has bucket 0's
	// slot, c the next one (no bucket), so a holds buckets 1 and 2.
	slot := SlotOf("hot")
	var lopsided []SlotRange
	for i := 0; i < 16384; i++ {
		owner := "a:1"
		switch i {
		case slot:
			owner = "b:1"
		case (slot + 1) % 16384:
			owner = "c:1"
		}
		if n := len(lopsided); n > 0 && lopsided[n-1].Primary == owner {
			lopsided[n-1].To = i
			continue
		}
		lopsided = append(lopsided, SlotRange{From: i, To: i, Primary: owner})
	}
	pc := CheckPlacement(lopsided, "hot", 3)
	names := BucketNames("hot", 3)
	if d := cmp.Diff(map[string][]string{"a:1": names[1:]}, pc.Crowded); d != "" || pc.OK() {
		t.Errorf("crowded (-want +got):\n%s", d)
	}
	// A slot no primary serves is reported under "".
	if pc := CheckPlacement(nil, "hot", 2); pc.OK() || len(pc.Crowded[""]) != 2 {
		t.Errorf("no slot map: %+v", pc)
	}
}

// TestPlanMoves: a crowded primary gives its extra buckets' slots to the
// primaries holding the fewest; a spread sale needs no move; a slot no
// primary serves is refused.
func TestPlanMoves(t *testing.T) {
	names := BucketNames("hot", 3)
	// Every slot on a:1 but bucket 0's (b:1); c:1 has one empty slot.
	var m []SlotRange
	add := func(i int, owner string) {
		if n := len(m); n > 0 && m[n-1].Primary == owner && m[n-1].To == i-1 {
			m[n-1].To = i
			return
		}
		m = append(m, SlotRange{From: i, To: i, Primary: owner, ID: strings.ToUpper(owner[:1])})
	}
	spare := -1
	for i := 0; i < 16384; i++ {
		switch {
		case i == SlotOf(names[0]):
			add(i, "b:1")
		case spare < 0 && i != SlotOf(names[1]) && i != SlotOf(names[2]):
			spare = i
			add(i, "c:1")
		default:
			add(i, "a:1")
		}
	}
	moves, err := PlanMoves(m, "hot", 3)
	if err != nil || len(moves) != 1 {
		t.Fatalf("moves %+v, %v: want one", moves, err)
	}
	mv := moves[0]
	if mv.From != "a:1" || mv.FromID != "A" || mv.To != "c:1" || mv.ToID != "C" || len(mv.Buckets) != 1 || mv.Buckets[0] == names[0] {
		t.Errorf("move %+v: want one of a:1's buckets to c:1", mv)
	}
	cmds := mv.Commands([]string{"a:1", "b:1", "c:1"})
	s := strconv.Itoa(mv.Slot)
	want := []string{
		"redis-cli -h c -p 1 CLUSTER SETSLOT " + s + " IMPORTING A",
		"redis-cli -h a -p 1 CLUSTER SETSLOT " + s + " MIGRATING C",
		"while keys=$(redis-cli -h a -p 1 --raw CLUSTER GETKEYSINSLOT " + s + " 100) && [ -n \"$keys\" ]; do redis-cli -h a -p 1 MIGRATE c 1 \"\" 0 5000 KEYS $keys || break; done",
		"redis-cli -h c -p 1 CLUSTER SETSLOT " + s + " NODE C",
		"redis-cli -h a -p 1 CLUSTER SETSLOT " + s + " NODE C",
		"redis-cli -h b -p 1 CLUSTER SETSLOT " + s + " NODE C",
	}
	if d := cmp.Diff(want, cmds); d != "" {
		t.Errorf("commands (-want +got):\n%s", d)
	}

	even := []SlotRange{{0, 5460, "a:1", "A"}, {5461, 10922, "b:1", "B"}, {10923, 16383, "c:1", "C"}}
	if moves, err := PlanMoves(even, "hot", 3); err != nil || len(moves) != 0 {
		t.Errorf("a spread sale: %+v, %v; want no move", moves, err)
	}
	// Two primaries, three buckets: at most two on each, no move needed
	// unless all three sit on one.
	two := []SlotRange{{0, 16383, "a:1", "A"}}
	if _, err := PlanMoves(append(two, SlotRange{From: 16384, To: 16384, Primary: "b:1", ID: "B"}), "hot", 3); err != nil {
		t.Errorf("three buckets on a, b empty: %v", err)
	}
	if _, err := PlanMoves(nil, "hot", 2); err == nil || !strings.Contains(err.Error(), "no primary") {
		t.Errorf("no slot map: %v", err)
	}
}
