package stockgate

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// A sold-out lease lets an instance answer a keyed purchase of a sold-out
// sale from memory: while it is live no key is added to the sale
// (reserve.lua makes no reservation, and the other writers of a key wait
// for it to end), so a snapshot of the key holders read with it says which
// keys made no order (docs/architecture.md, "Answering keyed sold-out from
// memory"). soldlease.lua grants and renews it.

// SoldLease is the answer of TakeSoldLease or RenewSoldLease.
type SoldLease struct {
	// Granted is false when the lease was refused; Reason says why
	// ("unloaded", "split", "units", "changed", "large", "blocked", or
	// "unreplicated": granted, but no replica of the sale's primary
	// acknowledged it within the transfer wait) and a holder drops its
	// snapshot.
	Granted bool
	Reason  string
	// Version and Epoch identify the snapshot: a renewal names them.
	Version, Epoch string
	// Keys are the sale's key fields (user NUL Idempotency-Key) when taken.
	Keys []string
	// Until is when the holder stops using the snapshot unless renewed:
	// the time the call was sent plus the lease's length minus margin, on
	// this process's monotonic clock (Redis granted it after that).
	Until time.Time
}

// SoldLeaseMargin is taken off a lease's length for the error of the clocks
// (Redis' wall clock against this process's monotonic one over one lease).
const SoldLeaseMargin = 100 * time.Millisecond

// TakeSoldLease takes sku's sold-out lease for ttl (or joins the one live)
// and reads its key holders, when sku is loaded, unsplit and sold out and
// has at most maxKeys key fields. Only an unsplit sale is leased: a split
// one moves units between buckets.
func (g *Gate) TakeSoldLease(ctx context.Context, sku string, ttl time.Duration, maxKeys int) (SoldLease, error) {
	return g.soldLease(ctx, sku, ttl, "", "", maxKeys)
}

// RenewSoldLease extends the lease held with l's snapshot for ttl if no key
// writer stopped it, its epoch is the same and no unit came back.
func (g *Gate) RenewSoldLease(ctx context.Context, sku string, ttl time.Duration, l SoldLease) (SoldLease, error) {
	return g.soldLease(ctx, sku, ttl, l.Version, l.Epoch, 0)
}

func (g *Gate) soldLease(ctx context.Context, sku string, ttl time.Duration, version, epoch string, maxKeys int) (SoldLease, error) {
	sent := time.Now()
	k := g.KeysOf(sku)
	// Where the sale's primary has a replica, the grant counts only once a
	// replica holds it (WAIT, as a transfer's halves): a failover that
	// lost the lease would let the promoted replica reserve while the
	// snapshots it promised are still used.
	res, acked := g.execDurable(ctx, sku, g.lease, []string{k.Meta, k.Idem},
		[]string{strconv.FormatInt(ttl.Milliseconds(), 10), version, epoch, strconv.Itoa(maxKeys)})
	vals, err := res.ToArray()
	if err != nil {
		return SoldLease{}, fmt.Errorf("stockgate: sold-out lease: %w", err)
	}
	code, err := vals[0].AsInt64()
	if err != nil {
		return SoldLease{}, fmt.Errorf("stockgate: sold-out lease reply: %w", err)
	}
	if code != 1 {
		why, _ := vals[1].ToString()
		return SoldLease{Reason: why}, nil
	}
	if !acked {
		// The lease stands in Redis (reservations wait for it), but no
		// replica said it holds it: not used.
		return SoldLease{Reason: "unreplicated"}, nil
	}
	l := SoldLease{Granted: true, Until: sent.Add(ttl - SoldLeaseMargin)}
	if l.Version, err = str(vals[1]); err == nil {
		l.Epoch, err = str(vals[2])
	}
	if err != nil {
		return SoldLease{}, fmt.Errorf("stockgate: sold-out lease reply: %w", err)
	}
	if len(vals) > 4 {
		l.Keys = make([]string, 0, len(vals)-4)
		for _, v := range vals[4:] {
			f, err := v.ToString()
			if err != nil {
				return SoldLease{}, fmt.Errorf("stockgate: sold-out lease reply: %w", err)
			}
			l.Keys = append(l.Keys, f)
		}
	}
	return l, nil
}

// str reads a reply that Lua returned as a string or a number.
func str(m rueidis.RedisMessage) (string, error) {
	if s, err := m.ToString(); err == nil {
		return s, nil
	}
	n, err := m.AsInt64()
	return strconv.FormatInt(n, 10), err
}

// SetSeedLease makes every load of a sale (Seed) start it with a sold-out
// lease of d (0, the default: none): a deployment that answers sold-out
// from leases sets it to their length, so that a snapshot read before Redis
// lost a sale, and with it the lease, ends before the reloaded sale takes a
// key. No reservation is made in the first d after a load.
func (g *Gate) SetSeedLease(d time.Duration) { g.seedLease.Store(d.Milliseconds()) }

// SeedLease returns the sold-out lease every load starts a sale with now
// (SetSeedLease).
func (g *Gate) SeedLease() time.Duration {
	return time.Duration(g.seedLease.Load()) * time.Millisecond
}

// afterLease calls run until it reports no wait: a writer of a new key
// field that met a live sold-out lease (leasewait.lua) writes nothing and
// says how many ms until the lease ends; it is called again then, so that
// no lease is taken before it had its turn (solb). It returns run's error,
// or the context's.
func afterLease(ctx context.Context, run func() (waitMs int64, err error)) error {
	for {
		wait, err := run()
		if err != nil || wait <= 0 {
			return err
		}
		if !waitCtx(ctx, time.Duration(wait+1)*time.Millisecond) {
			return ctx.Err()
		}
	}
}
