package orderstore

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/flashsale/flashsale/internal/sale"
)

// Kinds of risk list entry (risk_entries.kind).
const (
	RiskBuyer = "buyer" // Value is a user id (sale.ValidUser)
	RiskIP    = "ip"    // Value is an address or a prefix, canonical (CanonicalRiskValue)
)

// Sources of risk list entries (risk_entries.source).
const (
	RiskByAdmin = "admin" // listed through the admin API
	RiskByAuto  = "auto"  // listed by flashsale itself (risk.Strikes), with an expiry
)

// MaxRiskReason is the longest reason of a risk list entry, in characters.
const MaxRiskReason = 200

// RiskEntry is one entry of the risk lists: a blocked buyer or IP range.
type RiskEntry struct {
	ID        int64
	Kind      string // RiskBuyer or RiskIP
	Value     string // a user id, or an address or prefix in canonical form
	Reason    string
	Source    string // RiskByAdmin or RiskByAuto
	Actor     string // who listed it (the audit trail's actor)
	CreatedAt time.Time
	// ExpiresAt is when the entry stops blocking; zero: never.
	ExpiresAt time.Time
}

// Live reports whether e blocks at now: it has no expiry, or its expiry is
// after now.
func (e RiskEntry) Live(now time.Time) bool { return e.ExpiresAt.IsZero() || now.Before(e.ExpiresAt) }

// RiskChange is a new risk list entry for AddRisk.
type RiskChange struct {
	Kind, Value, Reason string
	// Source is RiskByAdmin (the default when empty) or RiskByAuto.
	Source string
	// ExpiresAt is when the entry stops blocking; zero: never. It must be
	// after the time of the change.
	ExpiresAt time.Time
}

// RiskAuditEntry is one row of risk_audit: an add or a removal of a risk
// list entry, with the entry as it was, who did it and from where.
type RiskAuditEntry struct {
	ID        int64
	EntryID   int64
	Action    string // "add" or "remove"
	Kind      string
	Value     string
	Reason    string
	Source    string
	ExpiresAt time.Time // zero: none
	Actor     string
	SourceIP  string
	At        time.Time
}

// CanonicalRiskValue returns the value of a risk list entry of kind in its
// canonical form, or an error wrapping sale.ErrInvalid whose text names the
// rule (written for clients). A buyer is a user id (sale.ValidUser), kept as
// it is. An IP is an address (1.2.3.4, 2001:db8::1) or a prefix
// (10.0.0.0/8, 2001:db8::/32): canonical is the masked prefix, an address
// without its length, an IPv4-mapped IPv6 one (::ffff:1.2.3.4, /104 and
// longer) as IPv4, IPv6 in its shortest form; zones are refused.
func CanonicalRiskValue(kind, value string) (string, error) {
	switch kind {
	case RiskBuyer:
		if !sale.ValidUser(value) {
			return "", fmt.Errorf("%w: a buyer value must be a user id: 1-128 of A-Z a-z 0-9 _ . @ -", sale.ErrInvalid)
		}
		return value, nil
	case RiskIP:
		p, err := ParseRiskPrefix(value)
		if err != nil {
			return "", err
		}
		if p.IsSingleIP() {
			return p.Addr().String(), nil
		}
		return p.String(), nil
	}
	return "", fmt.Errorf("%w: kind must be buyer or ip", sale.ErrInvalid)
}

// ParseRiskPrefix parses an IP list value (an address or a prefix, see
// CanonicalRiskValue) as a masked prefix: an address is a prefix of its
// full length; IPv4-mapped IPv6 is IPv4.
func ParseRiskPrefix(value string) (netip.Prefix, error) {
	bad := fmt.Errorf("%w: an ip value must be an IPv4 or IPv6 address or prefix, e.g. 192.0.2.7, 198.51.100.0/24, 2001:db8::/32", sale.ErrInvalid)
	if value == "" || len(value) > 64 || strings.ContainsAny(value, "% \t") {
		return netip.Prefix{}, bad
	}
	var p netip.Prefix
	if strings.Contains(value, "/") {
		var err error
		if p, err = netip.ParsePrefix(value); err != nil {
			return netip.Prefix{}, bad
		}
	} else {
		a, err := netip.ParseAddr(value)
		if err != nil {
			return netip.Prefix{}, bad
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if a := p.Addr(); a.Is4In6() {
		if p.Bits() < 96 {
			return netip.Prefix{}, fmt.Errorf("%w: an IPv4-mapped IPv6 prefix must be /96 or longer", sale.ErrInvalid)
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// ValidRiskReason reports whether reason may be stored: 1..MaxRiskReason
// characters of valid UTF-8, not only spaces, no control characters.
func ValidRiskReason(reason string) bool {
	if !utf8.ValidString(reason) || strings.TrimSpace(reason) == "" || utf8.RuneCountInString(reason) > MaxRiskReason {
		return false
	}
	return strings.IndexFunc(reason, unicode.IsControl) < 0
}

// check validates c at now (as dbTime) and returns it canonical (Source
// filled in, ExpiresAt as dbTime).
func (c RiskChange) check(now time.Time) (RiskChange, error) {
	v, err := CanonicalRiskValue(c.Kind, c.Value)
	if err != nil {
		return c, err
	}
	c.Value = v
	if c.Source == "" {
		c.Source = RiskByAdmin
	}
	if !c.ExpiresAt.IsZero() {
		c.ExpiresAt = dbTime(c.ExpiresAt)
	}
	switch {
	case c.Source != RiskByAdmin && c.Source != RiskByAuto:
		return c, fmt.Errorf("%w: source must be admin or auto", sale.ErrInvalid)
	case !ValidRiskReason(c.Reason):
		return c, fmt.Errorf("%w: reason is required: 1-%d characters, no control characters", sale.ErrInvalid, MaxRiskReason)
	case !c.ExpiresAt.IsZero() && !c.ExpiresAt.After(now):
		return c, fmt.Errorf("%w: expires_at must be in the future", sale.ErrInvalid)
	}
	return c, nil
}

// validRiskKind reports whether kind filters a listing: a kind, or "" for all.
func validRiskKind(kind string) bool { return kind == "" || kind == RiskBuyer || kind == RiskIP }

// dbTime is t as both databases keep it: UTC, microseconds.
func dbTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }
