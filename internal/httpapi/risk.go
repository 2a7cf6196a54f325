package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
	"github.com/flashsale/flashsale/internal/sale"
)

// RiskAdmin is what the risk list admin routes need (risk.Admin: the
// database of record, and a change notice to every instance after each
// change). The actor of the audit rows is in ctx (orderstore.WithActor).
type RiskAdmin interface {
	List(ctx context.Context, kind string, now time.Time) ([]orderstore.RiskEntry, error)
	Add(ctx context.Context, c orderstore.RiskChange, now time.Time) (orderstore.RiskEntry, error)
	Remove(ctx context.Context, id int64, now time.Time) (orderstore.RiskEntry, error)
}

// Blocklist is the risk lists in memory (*risk.List).
type Blocklist interface {
	Blocked(user string, ip netip.Addr, now time.Time) (orderstore.RiskEntry, bool)
}

// maxRiskTTL bounds ttl_seconds: a year and a day.
const maxRiskTTL = 366 * 24 * 60 * 60

// Blocked returns an error answered 403 blocked when user, or the address
// r comes from (the client IP as the rate limits see it: a trusted proxy's
// X-Forwarded-For, else the peer), is on the risk lists at the request's
// time; nil otherwise, and when no Blocklist is configured. The buyer
// routes call it once the user is known (user "" checks the address only),
// before any other work: it costs map look-ups in memory.
//
// The refusal is honest on purpose (docs/risk.md): a buyer listed by
// mistake learns it at once and can appeal with the reference it carries
// (the entry's id); its reason stays with the operators. Farming new
// identities is made costly by the proof of work, not by hiding the list.
func (s *Server) Blocked(r *http.Request, user string) error {
	if s.cfg.Blocklist == nil {
		return nil
	}
	ip, _ := netip.ParseAddr(peerIP(r))
	e, ok := s.cfg.Blocklist.Blocked(user, ip, requestTime(r))
	if !ok {
		return nil
	}
	msg := fmt.Sprintf("You may not take part in this sale (reference R%d). If you think this is a mistake, contact support with the reference.", e.ID)
	if !e.ExpiresAt.IsZero() {
		msg = fmt.Sprintf("You may not take part in this sale until %s (reference R%d). If you think this is a mistake, contact support with the reference.",
			e.ExpiresAt.UTC().Format(time.RFC3339), e.ID)
	}
	return &publicError{base: fmt.Errorf("%w: entry %d (%s %s)", sale.ErrBlocked, e.ID, e.Kind, e.Value), msg: msg}
}

// riskEntryJSON is a risk list entry as the admin routes answer it.
type riskEntryJSON struct {
	ID        int64    `json:"id"`
	Kind      string   `json:"kind"`
	Value     string   `json:"value"`
	Reason    string   `json:"reason"`
	Source    string   `json:"source"`
	Actor     string   `json:"actor"`
	CreatedAt apiTime  `json:"created_at"`
	ExpiresAt *apiTime `json:"expires_at"`
}

func riskJSON(e orderstore.RiskEntry) riskEntryJSON {
	return riskEntryJSON{ID: e.ID, Kind: e.Kind, Value: e.Value, Reason: e.Reason, Source: e.Source, Actor: e.Actor,
		CreatedAt: apiTime{e.CreatedAt}, ExpiresAt: timePtr(e.ExpiresAt)}
}

// listRisk answers the entries live now, oldest first: all, or of ?kind=.
func (s *Server) listRisk(w http.ResponseWriter, r *http.Request) error {
	kind := r.URL.Query().Get("kind")
	if kind != "" && kind != orderstore.RiskBuyer && kind != orderstore.RiskIP {
		return invalid("kind must be buyer or ip")
	}
	es, err := s.cfg.Risk.List(r.Context(), kind, requestTime(r))
	if err != nil {
		return err
	}
	out := make([]riskEntryJSON, len(es))
	for i, e := range es {
		out[i] = riskJSON(e)
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out})
	return nil
}

// addRiskRequest is the body of POST /admin/v1/risk. An expiry is given as
// a time (expires_at) or a duration from now (ttl_seconds), not both;
// neither (or null): the entry blocks until removed.
type addRiskRequest struct {
	Kind       *string    `json:"kind"`
	Value      *string    `json:"value"`
	Reason     *string    `json:"reason"`
	ExpiresAt  *time.Time `json:"expires_at"`
	TTLSeconds *int64     `json:"ttl_seconds"`
}

// addRisk lists a buyer or an address range. Every refusal is a 400 with
// the rule broken, and writes nothing.
func (s *Server) addRisk(w http.ResponseWriter, r *http.Request) error {
	var req addRiskRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	now := requestTime(r)
	switch {
	case req.Kind == nil || (*req.Kind != orderstore.RiskBuyer && *req.Kind != orderstore.RiskIP):
		return invalid("kind is required: buyer or ip")
	case req.Value == nil:
		return invalid("value is required: a user id (kind buyer), or an IP address or prefix (kind ip)")
	case req.Reason == nil || !orderstore.ValidRiskReason(*req.Reason):
		return invalid("reason is required: 1-%d characters, no control characters", orderstore.MaxRiskReason)
	case req.ExpiresAt != nil && req.TTLSeconds != nil:
		return invalid("give expires_at or ttl_seconds, not both")
	case req.TTLSeconds != nil && (*req.TTLSeconds < 1 || *req.TTLSeconds > maxRiskTTL):
		return invalid("ttl_seconds must be 1..%d", maxRiskTTL)
	case req.ExpiresAt != nil && !req.ExpiresAt.After(now):
		return invalid("expires_at must be in the future")
	}
	value, err := orderstore.CanonicalRiskValue(*req.Kind, *req.Value)
	if err != nil {
		if *req.Kind == orderstore.RiskBuyer {
			return invalid("a buyer value must be a user id: 1-128 of A-Z a-z 0-9 _ . @ -")
		}
		return invalid("an ip value must be an IPv4 or IPv6 address or prefix, e.g. 192.0.2.7, 198.51.100.0/24, 2001:db8::/32")
	}
	c := orderstore.RiskChange{Kind: *req.Kind, Value: value, Reason: *req.Reason, Source: orderstore.RiskByAdmin}
	switch {
	case req.ExpiresAt != nil:
		c.ExpiresAt = req.ExpiresAt.UTC()
	case req.TTLSeconds != nil:
		c.ExpiresAt = now.Add(time.Duration(*req.TTLSeconds) * time.Second)
	}
	e, err := s.cfg.Risk.Add(r.Context(), c, now)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, riskJSON(e))
	return nil
}

// removeRisk takes an entry off the lists and answers it as it was.
func (s *Server) removeRisk(w http.ResponseWriter, r *http.Request) error {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		return invalid("id must be a positive whole number")
	}
	e, err := s.cfg.Risk.Remove(r.Context(), id, requestTime(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, riskJSON(e))
	return nil
}
