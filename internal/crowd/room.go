package crowd

import (
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/internal/room"
	"github.com/flashsale/flashsale/internal/sale"
)

// RoomAdmissions checks a waiting room's admission tokens (Admissions).
type RoomAdmissions struct{ Room *room.Room }

// VerifyAdmission implements Admissions: a refusal wraps sale.ErrNotAdmitted.
func (a RoomAdmissions) VerifyAdmission(token, sku, user string, opensAt, now time.Time) (bool, error) {
	err := a.Room.VerifyAdmission(token, sku, user, opensAt, now)
	if err == nil {
		return false, nil
	}
	return errors.Is(err, room.ErrAdmissionExpired), fmt.Errorf("%w: %w", sale.ErrNotAdmitted, err)
}
