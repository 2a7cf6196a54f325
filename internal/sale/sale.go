// Package sale is the vocabulary of flashsale: SKUs, reservations, orders,
// their statuses, the errors the purchase path returns and the input rules.
// It imports only the standard library.
package sale

import (
	"errors"
	"time"
)

// Status is the state of an order. The lifecycle is
// queued -> pending_payment -> paid | cancelled, or queued -> failed.
type Status string

const (
	// StatusQueued: accepted by the Redis gate, not yet in the database.
	StatusQueued Status = "queued"
	// StatusPendingPayment: applied in the database, stock taken, awaiting payment.
	StatusPendingPayment Status = "pending_payment"
	// StatusPaid: paid; its stock is never released.
	StatusPaid Status = "paid"
	// StatusCancelled: cancelled by the user or the payment timeout; stock given back.
	StatusCancelled Status = "cancelled"
	// StatusFailed: the database refused the reservation; stock given back.
	StatusFailed Status = "failed"
)

// Live reports whether an order in status s holds stock in the database.
func (s Status) Live() bool { return s == StatusPendingPayment || s == StatusPaid }

// SKU is the flash-sale configuration of one stock-keeping unit.
type SKU struct {
	ID string
	// TotalStock is the allocation of the sale: units ever offered (S0 plus restocks).
	TotalStock int64
	// Stock is the database stock: units not held by a live order.
	Stock        int64
	PerUserLimit int64
	// StartsAt and EndsAt bound the sale window; zero means unbounded.
	StartsAt time.Time
	EndsAt   time.Time
	// UpdatedAt changes on every admin update.
	UpdatedAt time.Time
	// Buckets is the number of stock buckets the gate splits the sale
	// over, each under its own Redis hash tag (1..MaxBuckets; 0 counts as 1).
	Buckets int
	// Crowd is how the sale meets its crowd: tickets and a waiting room.
	Crowd Crowd
	// Tag groups sales for the capacity forecast (flashsale plan -forecast
	// -tag): "" or 1-64 of [A-Za-z0-9_-] (ValidTag).
	Tag string
}

// Crowd is a sale's crowd settings (docs/crowd.md). The zero value is a
// sale without either: anyone signed in may buy at once.
type Crowd struct {
	// TicketRequired: a purchase needs a ticket, earned by solving a
	// proof-of-work challenge (403 ticket_required without one).
	TicketRequired bool
	// TicketsOpenAt is when challenges are first handed out (zero: at the
	// sale's start). It is not after the sale's start.
	TicketsOpenAt time.Time
	// WaitingRoom: buyers join a queue and buy only once admitted (403
	// not_admitted otherwise).
	WaitingRoom bool
	// AdmissionRate is the waiting room's admissions per second; 0 derives
	// it from the remaining stock and the gate's capacity.
	AdmissionRate int64
}

// Equal reports whether c and d are the same settings (times by instant).
func (c Crowd) Equal(d Crowd) bool {
	return c.TicketRequired == d.TicketRequired && c.TicketsOpenAt.Equal(d.TicketsOpenAt) &&
		c.WaitingRoom == d.WaitingRoom && c.AdmissionRate == d.AdmissionRate
}

// TicketsOpen returns when the sale starts handing out challenges.
func (s SKU) TicketsOpen() time.Time {
	if s.Crowd.TicketsOpenAt.IsZero() {
		return s.StartsAt
	}
	return s.Crowd.TicketsOpenAt
}

// BucketCount returns the sale's number of stock buckets (at least 1).
func (s SKU) BucketCount() int { return max(s.Buckets, 1) }

// SKUOfBucket returns the SKU of a stock bucket's name (the gate names
// bucket 0 by the SKU id and bucket b > 0 "<sku>~<n>"; '~' is not a
// SKU id character): the name itself for a SKU id.
func SKUOfBucket(name string) string {
	for i := 0; i < len(name); i++ {
		if name[i] == '~' {
			return name[:i]
		}
	}
	return name
}

// SaleState is what a buyer sees of a SKU.
type SaleState string

const (
	StateUpcoming SaleState = "upcoming"
	StateOnSale   SaleState = "on_sale"
	StateSoldOut  SaleState = "sold_out"
	StateEnded    SaleState = "ended"
)

// State returns the state of the sale at now given the units available.
func (s SKU) State(now time.Time, available int64) SaleState {
	switch {
	case !s.EndsAt.IsZero() && !now.Before(s.EndsAt):
		return StateEnded
	case !s.StartsAt.IsZero() && now.Before(s.StartsAt):
		return StateUpcoming
	case available <= 0:
		return StateSoldOut
	}
	return StateOnSale
}

// Open reports whether purchases are accepted at now (the window only, not stock).
func (s SKU) Open(now time.Time) bool {
	if !s.StartsAt.IsZero() && now.Before(s.StartsAt) {
		return false
	}
	return s.EndsAt.IsZero() || now.Before(s.EndsAt)
}

// Reservation is a purchase admitted by the Redis gate. It travels from the
// gate's outbox through the queue to the database, where it is applied once,
// keyed by OrderID.
type Reservation struct {
	OrderID  string `json:"order_id"`
	SKU      string `json:"sku_id"`
	User     string `json:"user_id"`
	Quantity int64  `json:"quantity"`
	// AcceptedAt is when the gate admitted it, in Unix milliseconds.
	AcceptedAt int64 `json:"accepted_at"`
	// IdempotencyKey is the client's Idempotency-Key, if any.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// ClientIP is the buyer's address as the API saw it (for the audit trail).
	ClientIP string `json:"client_ip,omitempty"`
	// Bucket names the gate's stock bucket that holds the reservation
	// when the sale is split over several (stockgate.BucketName); empty
	// for the SKU's own (bucket 0).
	Bucket string `json:"bucket,omitempty"`
}

// Validate reports whether r is well formed (a message that fails it can never be applied).
func (r Reservation) Validate() error {
	switch {
	case !ValidOrderID(r.OrderID):
		return errors.New("bad order_id")
	case !ValidSKU(r.SKU):
		return errors.New("bad sku_id")
	case !ValidUser(r.User):
		return errors.New("bad user_id")
	case r.Quantity < 1 || r.Quantity > MaxQuantity:
		return errors.New("bad quantity")
	case r.AcceptedAt <= 0:
		return errors.New("bad accepted_at")
	}
	return nil
}

// Order is an order as the database (or, while queued, the gate) knows it.
type Order struct {
	ID         string     `json:"order_id"`
	SKU        string     `json:"sku_id"`
	User       string     `json:"user_id"`
	Quantity   int64      `json:"quantity"`
	Status     Status     `json:"status"`
	CreatedAt  time.Time  `json:"created_at"`
	FailReason string     `json:"fail_reason,omitempty"`
	UpdatedAt  *time.Time `json:"updated_at,omitempty"`
	// ExpiresAt is when an unpaid order is released (nil for failed orders).
	ExpiresAt    *time.Time `json:"expires_at,omitempty"`
	PaidAt       *time.Time `json:"paid_at,omitempty"`
	CancelledAt  *time.Time `json:"cancelled_at,omitempty"`
	CancelReason string     `json:"cancel_reason,omitempty"`
	// PaymentRef is the payment's reference given with pay or the
	// provider's callback ("" when none was given, or unpaid).
	PaymentRef string `json:"payment_ref,omitempty"`
}

// Causes of a cancellation (orders.cancel_reason).
const (
	// CancelByUser: the buyer cancelled.
	CancelByUser = "user_cancel"
	// CancelPaymentTimeout: not paid before expires_at.
	CancelPaymentTimeout = "payment_timeout"
)

// Input limits. They are part of the API contract (documented in docs/api.md).
const (
	// MaxQuantity is the largest quantity one purchase may ask for.
	MaxQuantity = 100
	// MaxStock is the largest allocation of one SKU.
	MaxStock = 1_000_000_000
	// MaxPerUserLimit is the largest per-user limit.
	MaxPerUserLimit = 10_000
	// MaxIdempotencyKey is the longest Idempotency-Key accepted.
	MaxIdempotencyKey = 128
	// MaxBuckets is the largest number of stock buckets of one SKU.
	MaxBuckets = 64
	// MaxAdmissionRate is the largest admission rate of a waiting room
	// (buyers per second).
	MaxAdmissionRate = 1_000_000
)

// The id checks run on every request (several per purchase): byte loops over
// a class table instead of regexps (the patterns they implement are in the
// doc comments, and validate_test.go checks them against those regexps).
var (
	skuChars  = class("A-Za-z0-9_-")
	userChars = class("A-Za-z0-9_.@-")
	hexLower  = class("0-9a-f")
)

// class returns the membership table of a character class written as
// single bytes and a-b ranges.
func class(spec string) (t [256]bool) {
	for i := 0; i < len(spec); i++ {
		if i+2 < len(spec) && spec[i+1] == '-' {
			for c := int(spec[i]); c <= int(spec[i+2]); c++ {
				t[c] = true
			}
			i += 2
			continue
		}
		t[spec[i]] = true
	}
	return t
}

// all reports whether s has 1..maxLen bytes, each in t.
func all(s string, t *[256]bool, maxLen int) bool {
	if len(s) == 0 || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !t[s[i]] {
			return false
		}
	}
	return true
}

// ValidSKU reports whether id is an acceptable sku_id: 1-64 of [A-Za-z0-9_-]
// (^[A-Za-z0-9_-]{1,64}$). The pattern keeps ids safe as Redis key parts and
// NATS subject tokens.
func ValidSKU(id string) bool { return all(id, &skuChars, 64) }

// ValidTag reports whether tag is an acceptable SKU tag: empty (none) or
// what ValidSKU accepts.
func ValidTag(tag string) bool { return tag == "" || ValidSKU(tag) }

// ValidUser reports whether id is an acceptable user id: 1-128 of
// [A-Za-z0-9_.@-] (^[A-Za-z0-9_.@-]{1,128}$).
func ValidUser(id string) bool { return all(id, &userChars, 128) }

// ValidOrderID reports whether id has the form of an order id, a lower-case
// UUID (^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$).
func ValidOrderID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		switch i {
		case 8, 13, 18, 23:
			if id[i] != '-' {
				return false
			}
		default:
			if !hexLower[id[i]] {
				return false
			}
		}
	}
	return true
}

// ValidIdempotencyKey reports whether k is 1-128 printable ASCII characters
// without spaces (^[\x21-\x7e]{1,128}$).
func ValidIdempotencyKey(k string) bool {
	if len(k) == 0 || len(k) > MaxIdempotencyKey {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}
