package risk

import (
	"log/slog"

	"github.com/nats-io/nats.go"
)

// Subject is the core NATS subject of the risk lists' change notices: an
// instance that changed the lists publishes an empty message on it, and
// every instance (itself included) reloads at once. At most once: a lost
// notice is covered by each Syncer's one-second check of the change counter.
const Subject = "flashsale.risk.changed"

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

// Changed tells every instance that the lists changed.
func (a Announcer) Changed() {
	if err := a.nc.Publish(Subject, nil); err != nil {
		a.log.Warn("risk notice not published (instances catch up within their one-second check)", "err", err)
	}
}

// Subscribe makes every change notice a Notify of s.
func Subscribe(nc *nats.Conn, s *Syncer) (*nats.Subscription, error) {
	return nc.Subscribe(Subject, func(*nats.Msg) { s.Notify() })
}
