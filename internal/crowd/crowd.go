// Package crowd is what stands between a crowd and the stock gate:
// tickets (a proof of work per buyer) and the waiting room.
// Its Gate is the purchase path's check (purchase.Crowd), in memory only:
// a purchase that fails it never reaches Redis. docs/crowd.md describes
// the whole.
package crowd

import (
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/ticket"
)

// Admissions verifies a waiting room's admission tokens in memory.
// expired is true for an authentic admission of this buyer and sale that
// ran out.
type Admissions interface {
	VerifyAdmission(token, sku, user string, opensAt, now time.Time) (expired bool, err error)
}

// Gate checks a purchase against the sale's crowd settings. Any part may
// be nil: then what it checks is off (a sale that needs it refuses all).
type Gate struct {
	Tickets *ticket.Service
	Room    Admissions
}

var _ purchase.Crowd = Gate{}

// Admit implements purchase.Crowd: a sale with a waiting room needs an
// admission (which was given only to a buyer with a ticket where one is
// needed), else a sale with tickets needs a ticket. (The risk lists are
// checked before, for every sale: httpapi.Server.Blocked.)
func (g Gate) Admit(sku sale.SKU, req purchase.Request, now time.Time) (bool, error) {
	c := sku.Crowd
	switch {
	case c.WaitingRoom:
		if req.Admission == "" {
			return false, fmt.Errorf("%w: no admission (join: POST /api/v1/skus/%s/queue)", sale.ErrNotAdmitted, sku.ID)
		}
		if g.Room == nil {
			return false, fmt.Errorf("%w: this instance has no waiting room", sale.ErrNotAdmitted)
		}
		return g.Room.VerifyAdmission(req.Admission, sku.ID, req.User, sku.StartsAt, now)
	case c.TicketRequired:
		if g.Tickets == nil {
			return false, fmt.Errorf("%w: this instance issues no tickets", sale.ErrTicketRequired)
		}
		err := g.Tickets.Check(req.Ticket, sku, req.User, now)
		return errors.Is(err, ticket.ErrTicketExpired), err
	}
	return false, nil
}
