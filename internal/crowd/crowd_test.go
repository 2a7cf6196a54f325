package crowd

import (
	"errors"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/ticket"
)

type fakeRoom struct {
	expired bool
	err     error
	calls   int
}

func (f *fakeRoom) VerifyAdmission(token, sku, user string, opensAt, now time.Time) (bool, error) {
	f.calls++
	return f.expired, f.err
}

// TestAdmit: a sale without crowd settings passes; a waiting room needs an
// admission (and never asks for a ticket beside it); a ticket sale needs
// a ticket; expired is reported only for an authentic proof out of time.
func TestAdmit(t *testing.T) {
	tk, err := ticket.New(ticket.Config{Key: []byte("0123456789abcdef0123456789abcdef")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 12, 20, 0, 0, 0, time.UTC)
	room := &fakeRoom{}
	g := Gate{Tickets: tk, Room: room}
	req := purchase.Request{User: "u", SKU: "S"}
	plain := sale.SKU{ID: "S"}
	if exp, err := g.Admit(plain, req, now); exp || err != nil {
		t.Fatalf("a plain sale: %v %v", exp, err)
	}
	both := sale.SKU{ID: "S", Crowd: sale.Crowd{TicketRequired: true, WaitingRoom: true}}
	if _, err := g.Admit(both, req, now); !errors.Is(err, sale.ErrNotAdmitted) || room.calls != 0 {
		t.Fatalf("a room sale without an admission: %v (room asked %d times)", err, room.calls)
	}
	req.Admission = "a1.x"
	if _, err := g.Admit(both, req, now); err != nil || room.calls != 1 {
		t.Fatalf("a room sale with an admission the room accepts: %v", err)
	}
	room.expired, room.err = true, errors.New("expired")
	if exp, err := g.Admit(both, req, now); !exp || err == nil {
		t.Fatalf("an expired admission: %v %v", exp, err)
	}
	tix := sale.SKU{ID: "S", Crowd: sale.Crowd{TicketRequired: true}}
	if exp, err := g.Admit(tix, req, now); exp || !errors.Is(err, sale.ErrTicketRequired) {
		t.Fatalf("a ticket sale without a ticket: %v %v", exp, err)
	}
	if _, err := (Gate{}).Admit(tix, req, now); !errors.Is(err, sale.ErrTicketRequired) {
		t.Fatalf("a ticket sale on an instance without tickets: %v", err)
	}
	if _, err := (Gate{}).Admit(both, req, now); !errors.Is(err, sale.ErrNotAdmitted) {
		t.Fatalf("a room sale on an instance without a room: %v", err)
	}
}
