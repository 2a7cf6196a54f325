package risk

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
)

// Store is what Admin and Strikes change the lists through
// (*orderstore.Store). The actor of the audit rows comes from ctx
// (orderstore.WithActor).
type Store interface {
	AddRisk(ctx context.Context, c orderstore.RiskChange, now time.Time) (Entry, error)
	RemoveRisk(ctx context.Context, id int64, now time.Time) (Entry, error)
	RiskEntries(ctx context.Context, kind string, now time.Time) ([]Entry, error)
}

// Admin is the admin API's view of the lists (httpapi.RiskAdmin): each
// change is written to the store, then Changed is called (Announcer.Changed:
// every instance reloads at once).
type Admin struct {
	Store   Store
	Changed func()
}

// List returns the entries live at now, of kind (orderstore.RiskBuyer,
// orderstore.RiskIP, or "" for both), oldest first.
func (a Admin) List(ctx context.Context, kind string, now time.Time) ([]Entry, error) {
	return a.Store.RiskEntries(ctx, kind, now)
}

// Add lists c at now (see orderstore.Store.AddRisk) and announces it.
func (a Admin) Add(ctx context.Context, c orderstore.RiskChange, now time.Time) (Entry, error) {
	e, err := a.Store.AddRisk(ctx, c, now)
	if err == nil {
		a.changed()
	}
	return e, err
}

// Remove takes entry id off the lists at now (see
// orderstore.Store.RemoveRisk) and announces it.
func (a Admin) Remove(ctx context.Context, id int64, now time.Time) (Entry, error) {
	e, err := a.Store.RemoveRisk(ctx, id, now)
	if err == nil {
		a.changed()
	}
	return e, err
}

func (a Admin) changed() {
	if a.Changed != nil {
		a.Changed()
	}
}
