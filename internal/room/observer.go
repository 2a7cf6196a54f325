package room

// Observer receives the room's events, for the caller's metrics (labels
// should not include the SKU unless the SKUs are few). Methods are called
// synchronously on the request or controller path: keep them cheap.
type Observer interface {
	// Joined: a buyer took a new place (not a repeated Join).
	Joined(sku string)
	// Polled: a Poll was answered.
	Polled(sku string)
	// Admitted: the controller let n more positions through.
	Admitted(sku string, n int64)
	// EtaError: at a buyer's first admitted answer, the actual minus the
	// predicted admission time (seconds; positive: later than predicted).
	// Only for buyers who were once given an ETA.
	EtaError(sku string, seconds float64)
	// SoldOut: a Join or Poll was answered sold_out.
	SoldOut(sku string)
}

type nopObserver struct{}

func (nopObserver) Joined(string)            {}
func (nopObserver) Polled(string)            {}
func (nopObserver) Admitted(string, int64)   {}
func (nopObserver) EtaError(string, float64) {}
func (nopObserver) SoldOut(string)           {}
