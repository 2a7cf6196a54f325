// Package fleet records which instances serve, in which release group and
// version, and the canary trial's state, in Redis beside the sales: what the
// dashboard shows of a release and what flashsale canary writes.
//
// Keys (new in this release; an older release neither reads nor writes them):
//
//	<prefix>:instances  hash  instance id -> Instance JSON, rewritten every Beat period
//	<prefix>:canary     string  Canary JSON: the trial flashsale canary runs (absent: none ever ran)
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Instance is one running instance as it last reported itself.
type Instance struct {
	ID        string    `json:"id"`
	Version   string    `json:"version"`
	Commit    string    `json:"commit"`
	Group     string    `json:"group"` // stable or canary
	StartedAt time.Time `json:"started_at"`
	SeenAt    time.Time `json:"seen_at"`
	// Shadow, for an instance comparing decisions, its counts so far.
	Shadow *ShadowCounts `json:"shadow,omitempty"`
	// Features are the sale settings this instance enforces beyond the
	// first release's (FeatureCrowd): a setting is turned on only while
	// every instance reporting enforces it.
	Features []string `json:"features,omitempty"`
	// SoldOutLeaseMs is the sold-out lease this instance is set to
	// (FLASHSALE_SOLD_OUT_LEASE; 0: none), whether or not the fleet gate
	// lets it answer from one yet: every instance starts each load of a
	// sale that has sold with a lease as long as the longest one listed
	// (FeatureSoldLease).
	SoldOutLeaseMs int64 `json:"sold_out_lease_ms,omitempty"`
}

// FeatureCrowd: the instance enforces tickets and waiting rooms.
const FeatureCrowd = "crowd"

// FeatureSchema2: the instance reads reservations of the order stream's
// schema version 2 (several per message; orderqueue.SchemaBatch). An
// instance publishes it only while every instance reports this.
const FeatureSchema2 = "orders-schema-2"

// FeatureSoldLease: the instance's scripts honour a sale's sold-out lease
// (stockgate.TakeSoldLease: no reservation and no new key while it is
// live). An instance answers keyed sold-out from a lease's snapshot only
// while every instance reports this.
const FeatureSoldLease = "sold-out-lease"

// Lacking returns the ids of instances among in that do not report feature.
func Lacking(in []Instance, feature string) []string {
	var ids []string
	for _, i := range in {
		if !slices.Contains(i.Features, feature) {
			ids = append(ids, i.ID)
		}
	}
	return ids
}

// ShadowCounts are an instance's shadow comparisons since it started.
type ShadowCounts struct {
	SKUs     []string `json:"sku_ids"`
	Match    int64    `json:"match"`
	Mismatch int64    `json:"mismatch"`
	Dropped  int64    `json:"dropped"`
	Same     int64    `json:"same_script"`
}

// Canary is the state of the last canary trial (flashsale canary).
type Canary struct {
	// Share is the percentage of buyers sent to the canary group now.
	Share int `json:"share"`
	// State is running, promoted or aborted.
	State     string    `json:"state"`
	Steps     []int     `json:"steps"`
	Step      int       `json:"step"` // index in Steps of the current share
	Reason    string    `json:"reason,omitempty"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Fresh is how long after its last beat an instance is listed.
const Fresh = 30 * time.Second

// forget is how long after its last beat an instance's entry is deleted.
const forget = 10 * time.Minute

// Registry reads and writes the fleet's keys under one prefix.
type Registry struct {
	c      rueidis.Client
	prefix string
}

// New returns the registry of prefix on c.
func New(c rueidis.Client, prefix string) *Registry { return &Registry{c: c, prefix: prefix} }

func (r *Registry) instancesKey() string { return r.prefix + ":instances" }
func (r *Registry) canaryKey() string    { return r.prefix + ":canary" }

// Beat records in (its SeenAt set to now).
func (r *Registry) Beat(ctx context.Context, in Instance, now time.Time) error {
	in.SeenAt = now.UTC()
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return r.c.Do(ctx, r.c.B().Hset().Key(r.instancesKey()).FieldValue().FieldValue(in.ID, string(b)).Build()).Error()
}

// Leave deletes id's entry (a clean shutdown).
func (r *Registry) Leave(ctx context.Context, id string) error {
	return r.c.Do(ctx, r.c.B().Hdel().Key(r.instancesKey()).Field(id).Build()).Error()
}

// Instances lists the instances seen within Fresh of now, stable first,
// then by id; entries not seen for 10 minutes are deleted.
func (r *Registry) Instances(ctx context.Context, now time.Time) ([]Instance, error) {
	m, err := r.c.Do(ctx, r.c.B().Hgetall().Key(r.instancesKey()).Build()).AsStrMap()
	if err != nil {
		return nil, err
	}
	out := []Instance{}
	var stale []string
	for id, v := range m {
		var in Instance
		if json.Unmarshal([]byte(v), &in) != nil || now.Sub(in.SeenAt) > forget {
			stale = append(stale, id)
			continue
		}
		if now.Sub(in.SeenAt) <= Fresh {
			out = append(out, in)
		}
	}
	if len(stale) > 0 {
		_ = r.c.Do(ctx, r.c.B().Hdel().Key(r.instancesKey()).Field(stale...).Build()).Error()
	}
	slices.SortFunc(out, func(a, b Instance) int {
		if a.Group != b.Group {
			return strings.Compare(b.Group, a.Group) // stable before canary
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// SetCanary records the trial's state.
func (r *Registry) SetCanary(ctx context.Context, c Canary) error {
	if c.Steps == nil {
		c.Steps = []int{}
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return r.c.Do(ctx, r.c.B().Set().Key(r.canaryKey()).Value(string(b)).Build()).Error()
}

// Canary returns the last trial's state, nil if none ever ran.
func (r *Registry) Canary(ctx context.Context) (*Canary, error) {
	s, err := r.c.Do(ctx, r.c.B().Get().Key(r.canaryKey()).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var c Canary
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return nil, errors.New("fleet: the canary state in redis is not JSON")
	}
	return &c, nil
}

// Run beats every period until ctx ends, then leaves; self returns the
// instance's current report.
func (r *Registry) Run(ctx context.Context, period time.Duration, self func() Instance) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		bctx, cancel := context.WithTimeout(ctx, period)
		_ = r.Beat(bctx, self(), time.Now())
		cancel()
		select {
		case <-ctx.Done():
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = r.Leave(lctx, self().ID)
			cancel()
			return
		case <-t.C:
		}
	}
}
