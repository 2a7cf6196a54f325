package sale

import (
	"errors"
	"fmt"
)

// Errors of the purchase path. The HTTP layer maps each to a status and a
// stable machine-readable code; wrap them with %w, never replace them.
var (
	// ErrSoldOut is returned when the SKU has fewer units available than asked for.
	ErrSoldOut = errors.New("sold out")
	// ErrLimitReached is returned when the purchase would take the user past the per-user limit.
	ErrLimitReached = errors.New("per-user limit reached")
	// ErrUnknownSKU is returned when no flash sale exists for the SKU.
	ErrUnknownSKU = errors.New("unknown sku")
	// ErrSaleNotOpen is returned when the sale has not started yet.
	ErrSaleNotOpen = errors.New("sale not open")
	// ErrSaleEnded is returned when the sale window has closed.
	ErrSaleEnded = errors.New("sale ended")
	// ErrNotWarmed is returned by the gate when Redis holds no state for the
	// SKU (never warmed, or lost): nothing may be sold against it until re-seeded.
	ErrNotWarmed = errors.New("sku not loaded in redis")
	// ErrOrderNotFound is returned when no order has the id (or the caller may not see it).
	ErrOrderNotFound = errors.New("order not found")
	// ErrOrderExpired is returned when paying an order that was cancelled
	// (by its user or the payment timeout): the caller refunds.
	ErrOrderExpired = errors.New("order was cancelled or expired")
	// ErrOrderPaid is returned when cancelling an order that is paid.
	ErrOrderPaid = errors.New("order is paid")
	// ErrOrderFailed is returned when paying or cancelling an order the
	// database refused (it never held stock).
	ErrOrderFailed = errors.New("order failed")
	// ErrOrderQueued is returned when paying an order still queued (not yet
	// in the database): retry in a moment.
	ErrOrderQueued = errors.New("order is still queued")
	// ErrInvalid is returned for input that breaks the rules of the API.
	ErrInvalid = errors.New("invalid request")
	// ErrStockConflict is returned when an admin stock change would take
	// available stock below zero (more units are already sold or reserved).
	ErrStockConflict = errors.New("stock change conflicts with units already sold")
	// ErrBusy is returned when the database fallback is at its concurrency
	// cap (Redis is out and the database is saturated): try again shortly.
	ErrBusy = errors.New("the sale is very busy, please try again")
	// ErrUnavailable is returned when a dependency (Redis, the queue, the database) cannot serve now.
	ErrUnavailable = errors.New("temporarily unavailable")
	// ErrBucketsInFlight is returned when an admin change of a sale's
	// number of stock buckets finds reservations in flight (accepted, not
	// yet decided by the database): nothing was changed; retry once they
	// are decided.
	ErrBucketsInFlight = errors.New("the sale has reservations in flight: its stock buckets cannot be changed now")
	// ErrTicketRequired is returned when a purchase of a sale that needs a
	// ticket (a solved proof of work) carries no valid one.
	ErrTicketRequired = errors.New("a valid ticket is required")
	// ErrNotAdmitted is returned when a purchase of a sale with a waiting
	// room carries no valid admission for its buyer.
	ErrNotAdmitted = errors.New("not admitted by the waiting room")
	// ErrBlocked is returned when the buyer, or the address the request
	// comes from, is on the risk lists (docs/risk.md): the buyer routes
	// answer 403 blocked.
	ErrBlocked = errors.New("blocked by the risk lists")
	// ErrUnknownRiskEntry is returned when no live risk list entry has the id.
	ErrUnknownRiskEntry = errors.New("unknown risk list entry")
	// ErrNoHistory is returned when a sale's history is asked for before
	// there is anything to record: it has not started, or it has no window
	// and no purchase was counted.
	ErrNoHistory = errors.New("nothing to record yet")
)

// ErrInvalidBuckets is the sale.ErrInvalid of a number of stock buckets
// outside 1..MaxBuckets.
var ErrInvalidBuckets = fmt.Errorf("%w: buckets must be 1..%d", ErrInvalid, MaxBuckets)
