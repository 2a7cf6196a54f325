package httpapi

import (
	"io"
	"net/http"
	"sync/atomic"
)

// drainingBody is what GET /readyz answers while an instance drains.
const drainingBody = `{"status":"draining","ready":false,"checks":{}}` + "\n"

// Drain wraps a handler for a graceful shutdown. Until Begin it serves the
// wrapped handler unchanged. From Begin on, GET /readyz answers 503 with
// {"status":"draining","ready":false,"checks":{}} (the load balancer takes
// the instance out), and every other request is still served by the wrapped
// handler but its response carries Connection: close, so a keep-alive
// client's next request opens a new connection (to another instance).
// Draining never ends: the server is shut down after it. Safe for
// concurrent use.
type Drain struct {
	next     http.Handler
	draining atomic.Bool
}

// NewDrain returns a Drain that serves next.
func NewDrain(next http.Handler) *Drain { return &Drain{next: next} }

// Begin starts draining. Calling it again does nothing.
func (d *Drain) Begin() { d.draining.Store(true) }

// ServeHTTP serves r as described on Drain.
func (d *Drain) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !d.draining.Load() {
		d.next.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Connection", "close")
	if r.URL.Path == "/readyz" {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, drainingBody)
		return
	}
	d.next.ServeHTTP(w, r)
}
