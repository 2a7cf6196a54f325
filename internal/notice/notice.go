// Package notice spreads "this sale changed" notices between instances over
// core NATS, so that each forgets its sold-out flag and reloads its catalog
// at once.
package notice

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
)

// Subject is the core NATS subject of change notices: an instance that
// changed a sale (admin PUT, warm-up) or gave units back to Redis (release
// restored, refused reservation compensated) publishes {"sku_id","reason"}
// on it, and every instance forgets its sold-out flag of that SKU and, for
// put and warmup, reloads its catalog. Core NATS (at most once): a lost
// notice is covered by the catalog refresh period and the sold-out flag's
// TTL.
const Subject = "flashsale.catalog.changed"

type catalogNotice struct {
	SKU    string `json:"sku_id"`
	Reason string `json:"reason"`
}

// Announcer publishes change notices on Subject. It never blocks on the
// broker and never fails: a notice that cannot be published is logged.
type Announcer struct {
	nc  *nats.Conn
	log *slog.Logger
}

// NewAnnouncer returns an Announcer publishing on nc.
func NewAnnouncer(nc *nats.Conn, log *slog.Logger) Announcer {
	return Announcer{nc: nc, log: log}
}

// Announce tells every instance, this one included, that sku changed for
// reason (put, warmup, restore, compensate, ...).
func (a Announcer) Announce(sku, reason string) {
	b, _ := json.Marshal(catalogNotice{SKU: sku, Reason: reason})
	if err := a.nc.Publish(Subject, b); err != nil {
		a.log.Warn("catalog notice not published (peers catch up by their refresh period and sold-out TTL)", "sku_id", sku, "reason", reason, "err", err)
	}
}

// Noticer applies a notice (purchase.Service): it forgets the sold-out flag
// of sku (of every SKU when sku is empty) and, with reload, reloads the
// catalog.
type Noticer interface {
	Noticed(sku string, reload bool)
}

// Subscribe applies every instance's change notices to n: reload for every
// reason but restore and compensate, which give units back and change no
// setting. Malformed notices are logged and ignored.
func Subscribe(nc *nats.Conn, n Noticer, log *slog.Logger) (*nats.Subscription, error) {
	return nc.Subscribe(Subject, func(m *nats.Msg) {
		var c catalogNotice
		if err := json.Unmarshal(m.Data, &c); err != nil {
			log.Warn("ignoring a malformed catalog notice", "data", string(m.Data))
			return
		}
		// A stock bucket's name ("<sku>~<n>", sent by releases that
		// announced a split sale's compensation under it) names its SKU.
		c.SKU = sale.SKUOfBucket(c.SKU)
		if c.SKU != "" && !sale.ValidSKU(c.SKU) {
			log.Warn("ignoring a malformed catalog notice", "data", string(m.Data))
			return
		}
		n.Noticed(c.SKU, c.Reason != "restore" && c.Reason != "compensate")
	})
}

// AnnouncingGate is the gate as the restorer and the consumer use it: when
// it gives units back (a release restored, a refused reservation
// compensated) every instance hears of it and sells them again at once.
type AnnouncingGate struct {
	*stockgate.Gate
	Announcer interface{ Announce(sku, reason string) }
}

// Restore is stockgate.Gate.Restore, announced with reason "restore" when
// it gave units back.
func (g AnnouncingGate) Restore(ctx context.Context, sku string, rs []stockgate.Release) (int64, error) {
	n, err := g.Gate.Restore(ctx, sku, rs)
	if n > 0 {
		g.Announcer.Announce(sku, "restore")
	}
	return n, err
}

// Finalize is stockgate.Gate.Finalize, announced with reason "compensate"
// when it gave units back. The notice names the SKU, never a stock
// bucket (bucket is one for a split sale): subscribers, of this release
// and the ones before, accept SKU ids only.
func (g AnnouncingGate) Finalize(ctx context.Context, bucket string, outcomes []stockgate.Outcome) (int64, error) {
	n, err := g.Gate.Finalize(ctx, bucket, outcomes)
	if n > 0 {
		g.Announcer.Announce(stockgate.SKUOf(bucket), "compensate")
	}
	return n, err
}
