package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestReadyzHungCheck: a dependency that hangs (a JetStream stream between
// leaders, a black-holed Redis) reads as its check unavailable within
// readyTimeout, so a balancer's health check (HAProxy's deadline is its
// inter, 1 s) sees the instance answer: 200 degraded for a non-critical
// check, 503 for a critical one. Before, the checks ran one after the other
// with the request's context, and a hung one held /readyz until the
// balancer gave up and took every instance out.
func TestReadyzHungCheck(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	hang := func(context.Context) error { <-release; return nil } // ignores its context
	ok := func(context.Context) error { return nil }
	down := func(context.Context) error { return errors.New("down") }
	for _, tc := range []struct {
		name   string
		checks []Checker
		code   int
		status string
		want   map[string]string
	}{
		{"hung non-critical", []Checker{{Name: "db", Critical: true, Check: ok}, {Name: "streams", Check: hang}},
			200, "degraded", map[string]string{"db": "ok", "streams": "unavailable"}},
		{"hung critical", []Checker{{Name: "db", Critical: true, Check: hang}, {Name: "streams", Check: ok}},
			503, "unavailable", map[string]string{"db": "unavailable", "streams": "ok"}},
		{"failed and hung", []Checker{{Name: "db", Critical: true, Check: ok}, {Name: "redis", Check: down}, {Name: "streams", Check: hang}},
			200, "degraded", map[string]string{"db": "ok", "redis": "unavailable", "streams": "unavailable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(nil, nil, slog.New(slog.DiscardHandler), Config{Ready: tc.checks})
			done := make(chan *httptest.ResponseRecorder, 1)
			go func() {
				w := httptest.NewRecorder()
				s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
				done <- w
			}()
			var w *httptest.ResponseRecorder
			select {
			case w = <-done:
			case <-time.After(10 * readyTimeout): // a hang, not a slow machine
				t.Fatal("/readyz did not answer while a check hung")
			}
			var body struct {
				Status string            `json:"status"`
				Ready  bool              `json:"ready"`
				Checks map[string]string `json:"checks"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if w.Code != tc.code || body.Status != tc.status || body.Ready != (tc.code == 200) {
				t.Fatalf("/readyz: %d %s", w.Code, w.Body)
			}
			for k, v := range tc.want {
				if body.Checks[k] != v {
					t.Fatalf("check %s: %q, want %q (%s)", k, body.Checks[k], v, w.Body)
				}
			}
		})
	}
}

// TestReadyzLevels: a check decides its own level and reason with Degraded
// or Unready; a plain failure takes its Checker's (Critical: unready); the
// reasons are listed under "degraded" and "unready", the errors' own text
// never.
func TestReadyzLevels(t *testing.T) {
	ok := func(context.Context) error { return nil }
	fail := func(err error) func(context.Context) error { return func(context.Context) error { return err } }
	secret := errors.New("dial tcp 10.0.0.7:5432: too many clients")
	for _, tc := range []struct {
		name     string
		checks   []Checker
		code     int
		status   string
		degraded map[string]string
		unready  map[string]string
	}{
		{"all ok", []Checker{{Name: "purchases", Critical: true, Check: ok}, {Name: "db", Check: ok}},
			200, "ok", nil, nil},
		{"db slots exhausted, purchases ok", []Checker{{Name: "purchases", Critical: true, Check: ok},
			{Name: "db", Check: fail(Degraded("connection slots exhausted", secret))}},
			200, "degraded", map[string]string{"db": "connection slots exhausted"}, nil},
		{"plain failure of a non-critical check", []Checker{{Name: "purchases", Critical: true, Check: ok}, {Name: "broker", Check: fail(secret)}},
			200, "degraded", map[string]string{"broker": "unavailable"}, nil},
		{"critical check degrades itself", []Checker{{Name: "purchases", Critical: true, Check: fail(Degraded("fallback only", secret))}},
			200, "degraded", map[string]string{"purchases": "fallback only"}, nil},
		{"non-critical check takes the instance out", []Checker{{Name: "purchases", Critical: true, Check: ok},
			{Name: "policy", Check: fail(Unready("maxmemory-policy is allkeys-lru", secret))}},
			503, "unavailable", nil, map[string]string{"policy": "maxmemory-policy is allkeys-lru"}},
		{"purchases impossible", []Checker{{Name: "purchases", Critical: true, Check: fail(secret)}, {Name: "db", Check: fail(Degraded("down", secret))}},
			503, "unavailable", map[string]string{"db": "down"}, map[string]string{"purchases": "unavailable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(nil, nil, slog.New(slog.DiscardHandler), Config{Ready: tc.checks})
			w := httptest.NewRecorder()
			s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			var body struct {
				Status   string            `json:"status"`
				Ready    bool              `json:"ready"`
				Checks   map[string]string `json:"checks"`
				Degraded map[string]string `json:"degraded"`
				Unready  map[string]string `json:"unready"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if w.Code != tc.code || body.Status != tc.status || body.Ready != (tc.code == 200) {
				t.Fatalf("/readyz: %d %s", w.Code, w.Body)
			}
			if diff := cmp.Diff(tc.degraded, body.Degraded); diff != "" {
				t.Errorf("degraded (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.unready, body.Unready); diff != "" {
				t.Errorf("unready (-want +got):\n%s", diff)
			}
			for _, c := range tc.checks {
				want := "ok"
				if tc.degraded[c.Name] != "" || tc.unready[c.Name] != "" {
					want = "unavailable"
				}
				if body.Checks[c.Name] != want {
					t.Errorf("checks[%s] = %q, want %q", c.Name, body.Checks[c.Name], want)
				}
			}
			if strings.Contains(w.Body.String(), "10.0.0.7") {
				t.Errorf("/readyz shows an error's own text: %s", w.Body)
			}
		})
	}
}
