package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/flashsale/flashsale/api"
	"github.com/flashsale/flashsale/internal/deadletter"
	"github.com/flashsale/flashsale/internal/orderqueue"
	"github.com/flashsale/flashsale/internal/sale"
)

// Checker is one named readiness check of GET /readyz. Check returns nil
// while its dependency is usable. A failure makes the instance unready
// (503) if Critical, else degraded (200, status "degraded"); a check may set
// the level and a reason of its own for one answer by returning a
// *CheckError (Degraded, Unready). Readiness means "this instance can take
// purchases": only the checks that decide that are Critical (or answer
// Unready); everything else that is out is reported, with its reason, and
// degrades.
type Checker struct {
	Name     string
	Critical bool
	Check    func(ctx context.Context) error
}

// Levels a failed readiness check sets (see CheckError).
type Level int

const (
	// LevelOf the Checker: unready if Critical, else degraded.
	LevelOf Level = iota
	// LevelDegraded: reported; the instance stays ready.
	LevelDegraded
	// LevelUnready: the instance is taken out (503).
	LevelUnready
)

// CheckError is a readiness check's failure with its level and a reason
// shown in /readyz's "degraded" or "unready" maps. The reason must name no
// address, credential or driver text (/readyz answers anyone); Err, which
// may, goes to the log.
type CheckError struct {
	Level  Level
	Reason string
	Err    error
}

func (e *CheckError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

func (e *CheckError) Unwrap() error { return e.Err }

// Degraded returns a check failure that degrades the instance, with reason.
func Degraded(reason string, err error) error {
	return &CheckError{Level: LevelDegraded, Reason: reason, Err: err}
}

// Unready returns a check failure that takes the instance out, with reason.
func Unready(reason string, err error) error {
	return &CheckError{Level: LevelUnready, Reason: reason, Err: err}
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) error {
	if s.cfg.Audit == nil {
		return errNotFound
	}
	id := r.PathValue("sku_id")
	if !sale.ValidSKU(id) {
		return errBadSKUID
	}
	after, err := queryUint(r, "after", 0)
	if err != nil {
		return err
	}
	limit, err := queryUint(r, "limit", 100)
	if err != nil || limit < 1 || limit > 1000 {
		return invalid("limit must be 1..1000")
	}
	es, err := s.cfg.Audit.Audit(r.Context(), id, int64(after), int(limit))
	if err != nil {
		return err
	}
	next := int64(after)
	if len(es) > 0 {
		next = es[len(es)-1].ID
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": es, "next_after": next})
	return nil
}

// openAPI serves the API's OpenAPI document (api/openapi.yaml).
func (s *Server) openAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(api.OpenAPI)
	return nil
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// readyTimeout bounds each readiness check.
const readyTimeout = 700 * time.Millisecond

var errCheckTimeout = errors.New("readiness check did not answer in time")

// readyz answers 200 while the instance can take purchases: status "ok",
// or "degraded" when a check that does not decide it failed (the database,
// the broker, ...: purchases go on through Redis and the outbox, or through
// the database fallback). 503 "unavailable" when a check that decides it
// failed. "checks" has every check "ok" or "unavailable"; "degraded" and
// "unready" (present when not empty) name each failed one with its reason.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	checks := map[string]string{}
	degraded, unready := map[string]string{}, map[string]string{}
	status, code := "ok", http.StatusOK
	// The checks run at once, each under readyTimeout: a balancer's health
	// check has a deadline of its own (HAProxy's is its inter, 1 s in the
	// shipped configuration), and a dependency that hangs (a stream between
	// leaders) must read as that check unavailable, not as the whole
	// instance not answering.
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	type result struct {
		i   int
		err error
	}
	done := make(chan result, len(s.cfg.Ready)) // buffered: a late check never blocks
	for i, c := range s.cfg.Ready {
		go func() { done <- result{i, c.Check(ctx)} }()
	}
	errs := make([]error, len(s.cfg.Ready))
	for i := range errs {
		errs[i] = errCheckTimeout // until it answers
	}
wait:
	for range errs {
		select {
		case r := <-done:
			errs[r.i] = r.err
		case <-ctx.Done():
			break wait // the rest stay timed out
		}
	}
	for i, c := range s.cfg.Ready {
		err := errs[i]
		if err == nil {
			checks[c.Name] = "ok"
			continue
		}
		// The error names addresses and drivers: the log gets it.
		s.log.Info("readyz: check failed", "check", c.Name, "err", err)
		checks[c.Name] = "unavailable"
		level, reason := LevelOf, "unavailable"
		if errors.Is(err, errCheckTimeout) {
			reason = "did not answer within " + readyTimeout.String()
		}
		if ce, ok := errors.AsType[*CheckError](err); ok {
			level, reason = ce.Level, ce.Reason
		}
		if level == LevelOf {
			level = LevelDegraded
			if c.Critical {
				level = LevelUnready
			}
		}
		if level == LevelUnready {
			unready[c.Name] = reason
			status, code = "unavailable", http.StatusServiceUnavailable
		} else {
			degraded[c.Name] = reason
			if status == "ok" {
				status = "degraded"
			}
		}
	}
	body := map[string]any{"status": status, "ready": code == http.StatusOK, "checks": checks}
	if len(degraded) > 0 {
		body["degraded"] = degraded
	}
	if len(unready) > 0 {
		body["unready"] = unready
	}
	if s.cfg.Breaker != nil {
		body["breaker"] = s.cfg.Breaker()
		if body["breaker"] != "closed" && status == "ok" {
			body["status"] = "degraded"
		}
	}
	writeJSON(w, code, body)
	return nil
}

func (s *Server) listDLQ(w http.ResponseWriter, r *http.Request) error {
	if s.cfg.DeadLetters == nil {
		return errNotFound
	}
	after, err := queryUint(r, "after", 0)
	if err != nil {
		return err
	}
	limit, err := queryUint(r, "limit", 100)
	if err != nil || limit < 1 || limit > 1000 {
		return invalid("limit must be 1..1000")
	}
	ds, n, err := s.cfg.DeadLetters.List(r.Context(), after, int(limit))
	if err != nil {
		return err
	}
	if ds == nil {
		ds = []orderqueue.DeadLetter{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"dead_letters": ds, "count": n})
	return nil
}

func (s *Server) dlqAction(replay bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.cfg.DeadLetters == nil {
			return errNotFound
		}
		seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
		if err != nil || seq == 0 {
			return invalid("seq must be a positive whole number")
		}
		var a deadletter.Action
		if replay {
			a, err = s.cfg.DeadLetters.Replay(r.Context(), seq)
		} else {
			a, err = s.cfg.DeadLetters.Discard(r.Context(), seq)
		}
		if deadletter.IsNotFound(err) {
			return errNoDeadLetter
		}
		if replay && errors.Is(err, sale.ErrInvalid) {
			return &publicError{base: err, msg: fmt.Sprintf("dead letter %d is malformed and cannot be replayed; discard it", seq)}
		}
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, a)
		return nil
	}
}

func queryUint(r *http.Request, name string, def uint64) (uint64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, invalid("%s must be a whole number", name)
	}
	return n, nil
}
