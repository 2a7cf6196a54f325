package stockgate

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// SlotOf returns the Redis Cluster slot of a hash tag (CRC16 mod 16384).
func SlotOf(tag string) int { return slotOf(tag) }

// SlotRange is a range of slots served by one primary.
type SlotRange struct {
	From, To int    // inclusive
	Primary  string // host:port
	ID       string // the node id
}

// ClusterSlots reads the slot map of the cluster c talks to (CLUSTER SLOTS).
func ClusterSlots(ctx context.Context, c rueidis.Client) ([]SlotRange, error) {
	v, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("stockgate: CLUSTER SLOTS: %w", err)
	}
	var out []SlotRange
	for _, e := range v {
		a, err := e.ToArray()
		if err != nil || len(a) < 3 {
			return nil, fmt.Errorf("stockgate: CLUSTER SLOTS: unexpected entry")
		}
		from, _ := a[0].AsInt64()
		to, _ := a[1].AsInt64()
		node, err := a[2].ToArray()
		if err != nil || len(node) < 3 {
			return nil, fmt.Errorf("stockgate: CLUSTER SLOTS: unexpected node")
		}
		host, _ := node[0].ToString()
		port, _ := node[1].AsInt64()
		id, _ := node[2].ToString()
		out = append(out, SlotRange{From: int(from), To: int(to), Primary: host + ":" + strconv.FormatInt(port, 10), ID: id})
	}
	slices.SortFunc(out, func(a, b SlotRange) int { return a.From - b.From })
	return out, nil
}

// Placement is where one stock bucket of a sale lives.
type Placement struct {
	Bucket  string
	Slot    int
	Primary string // "" when no primary serves the slot
}

// PlacementCheck is the answer of CheckPlacement.
type PlacementCheck struct {
	Placements []Placement
	Primaries  int // primaries in the cluster
	// Allowed is the most buckets one primary should hold: 1 when the
	// buckets are no more than the primaries, else ceil(k / primaries).
	Allowed int
	// Crowded lists the primaries holding more than Allowed buckets (or
	// any bucket on no primary, under ""), with their buckets.
	Crowded map[string][]string
}

// OK reports whether the buckets are spread as evenly as the primaries allow.
func (p PlacementCheck) OK() bool { return len(p.Crowded) == 0 }

// CheckPlacement places the k buckets of sku on the slot map and says
// whether they sit on different primaries (as evenly as possible when k
// exceeds the primaries).
func CheckPlacement(slots []SlotRange, sku string, k int) PlacementCheck {
	ids := map[string]bool{}
	for _, r := range slots {
		ids[r.Primary] = true
	}
	var pc PlacementCheck
	pc.Primaries = len(ids)
	pc.Allowed = 1
	if n := pc.Primaries; n > 0 && k > n {
		pc.Allowed = (k + n - 1) / n
	}
	held := map[string][]string{}
	for _, b := range BucketNames(sku, k) {
		p := Placement{Bucket: b, Slot: slotOf(b)}
		for _, r := range slots {
			if p.Slot >= r.From && p.Slot <= r.To {
				p.Primary = r.Primary
				break
			}
		}
		pc.Placements = append(pc.Placements, p)
		held[p.Primary] = append(held[p.Primary], b)
	}
	for primary, bs := range held {
		if primary == "" || len(bs) > pc.Allowed {
			if pc.Crowded == nil {
				pc.Crowded = map[string][]string{}
			}
			pc.Crowded[primary] = bs
		}
	}
	return pc
}

// Move is one slot of a reshard plan: the slot holding Buckets goes from
// one primary to another.
type Move struct {
	Slot     int
	Buckets  []string
	From, To string // host:port
	FromID   string // node ids
	ToID     string
}

// PlanMoves returns the slot moves that spread sku's k stock buckets over
// the primaries as CheckPlacement wants (none when they already are): each
// primary holding more than Allowed gives slots of its extra buckets, one
// at a time, to the primary holding the fewest of the sale's buckets (the
// first address among equals). Buckets whose names hash to one slot move
// together; when that makes the spread impossible it says so.
func PlanMoves(slots []SlotRange, sku string, k int) ([]Move, error) {
	pc := CheckPlacement(slots, sku, k)
	ids := map[string]string{}
	for _, r := range slots {
		ids[r.Primary] = r.ID
	}
	primaries := Primaries(slots)
	bySlot := map[int][]string{}
	owner := map[int]string{}
	count := map[string]int{}
	for _, p := range pc.Placements {
		if p.Primary == "" {
			return nil, fmt.Errorf("stockgate: slot %d of bucket %s has no primary: fix the cluster first", p.Slot, p.Bucket)
		}
		bySlot[p.Slot] = append(bySlot[p.Slot], p.Bucket)
		owner[p.Slot] = p.Primary
		count[p.Primary]++
	}
	var moves []Move
	for _, from := range primaries {
		for count[from] > pc.Allowed {
			// The primary's slot with the fewest of the sale's buckets, the
			// highest slot among equals (a stable choice).
			slot := -1
			for s, bs := range bySlot {
				if owner[s] == from && (slot < 0 || len(bs) < len(bySlot[slot]) || len(bs) == len(bySlot[slot]) && s > slot) {
					slot = s
				}
			}
			n := len(bySlot[slot])
			to := ""
			for _, p := range primaries {
				if p != from && count[p]+n <= pc.Allowed && (to == "" || count[p] < count[to]) {
					to = p
				}
			}
			if to == "" {
				return nil, fmt.Errorf("stockgate: the buckets of %s cannot be spread over %d primaries: %s share slot %d (choose another bucket count)",
					sku, len(primaries), strings.Join(bySlot[slot], ", "), slot)
			}
			moves = append(moves, Move{Slot: slot, Buckets: bySlot[slot], From: from, FromID: ids[from], To: to, ToID: ids[to]})
			owner[slot] = to
			count[from] -= n
			count[to] += n
		}
	}
	slices.SortFunc(moves, func(a, b Move) int { return a.Slot - b.Slot })
	return moves, nil
}

// Commands returns the redis-cli commands that move m's slot with its
// keys, Redis Cluster's own procedure for one slot (redis-cli --cluster
// reshard moves a number of slots of its choosing, not a given one): the
// destination imports it, the source migrates it, its keys move in
// batches of 100 until none is left, then every primary (others) learns
// the new owner. With a password, export REDISCLI_AUTH and add
// AUTH <password> to MIGRATE.
func (m Move) Commands(others []string) []string {
	cli := func(addr string) string {
		host, port, _ := strings.Cut(addr, ":")
		return "redis-cli -h " + host + " -p " + port
	}
	dhost, dport, _ := strings.Cut(m.To, ":")
	s := strconv.Itoa(m.Slot)
	out := []string{
		cli(m.To) + " CLUSTER SETSLOT " + s + " IMPORTING " + m.FromID,
		cli(m.From) + " CLUSTER SETSLOT " + s + " MIGRATING " + m.ToID,
		"while keys=$(" + cli(m.From) + " --raw CLUSTER GETKEYSINSLOT " + s + " 100) && [ -n \"$keys\" ]; do " +
			cli(m.From) + " MIGRATE " + dhost + " " + dport + " \"\" 0 5000 KEYS $keys || break; done",
		cli(m.To) + " CLUSTER SETSLOT " + s + " NODE " + m.ToID,
		cli(m.From) + " CLUSTER SETSLOT " + s + " NODE " + m.ToID,
	}
	for _, o := range others {
		if o != m.From && o != m.To {
			out = append(out, cli(o)+" CLUSTER SETSLOT "+s+" NODE "+m.ToID)
		}
	}
	return out
}

// Primaries returns the addresses of the primaries serving slots, sorted.
func Primaries(slots []SlotRange) []string {
	var out []string
	for _, r := range slots {
		if !slices.Contains(out, r.Primary) {
			out = append(out, r.Primary)
		}
	}
	slices.Sort(out)
	return out
}
