package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderstore"
)

// TestRoutingAnswers: requests no route takes are answered as they were
// when the mux routed each request twice: 404 not_found or 405 with the
// methods of the path in Allow, in JSON; the mux's redirects to a cleaned
// path (or to a subtree's slash) where a route would take it; and routed
// requests reach their route.
func TestRoutingAnswers(t *testing.T) {
	s := New(nil, nil, slog.New(slog.DiscardHandler), Config{
		Dashboard: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("dash")) }),
		BuyerPage: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("buyer " + r.URL.Path)) }),
	})
	cases := []struct {
		method, path string
		status       int
		header, want string // a header's value, and a substring of the body
	}{
		{"GET", "/nope", 404, "Content-Type=application/json; charset=utf-8", `"not_found"`},
		{"GET", "/api/v1/orders", 405, "Allow=POST", `"method_not_allowed"`},
		{"DELETE", "/api/v1/orders/x", 405, "Allow=GET", `"method_not_allowed"`},
		{"PUT", "/healthz", 405, "Allow=GET", `"method_not_allowed"`},
		{"GET", "/api/v1/orders/", 404, "", `"not_found"`},
		{"GET", "/foo/../nope", 404, "", `"not_found"`},
		{"POST", "/api//v1/orders", 307, "Location=/api/v1/orders", ""},
		{"GET", "/dashboard", 307, "Location=/dashboard/", ""},
		{"GET", "/dashboard/x", 200, "", "dash"},
		{"GET", "/", 302, "Location=/dashboard/", ""},
		{"GET", "/sale/phone-1", 200, "", "buyer /sale/phone-1"},
		{"GET", "/sale/assets/app.js", 200, "", "buyer /sale/assets/app.js"},
		{"GET", "/sale/a/b", 404, "", `"not_found"`},
		{"POST", "/sale/phone-1", 405, "Allow=GET", `"method_not_allowed"`},
		{"GET", "/healthz", 200, "Cache-Control=no-store", `"ok"`},
		{"HEAD", "/healthz", 200, "", ""},
	}
	for _, c := range cases {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(c.method, c.path, nil))
		if w.Code != c.status {
			t.Errorf("%s %s: %d, want %d (%s)", c.method, c.path, w.Code, c.status, w.Body)
			continue
		}
		if k, v, ok := strings.Cut(c.header, "="); ok && w.Header().Get(k) != v {
			t.Errorf("%s %s: %s %q, want %q", c.method, c.path, k, w.Header().Get(k), v)
		}
		if !strings.Contains(w.Body.String(), c.want) {
			t.Errorf("%s %s: body %q, want %q in it", c.method, c.path, w.Body, c.want)
		}
		if c.status >= 400 && w.Header().Get("X-Content-Type-Options") != "" {
			t.Errorf("%s %s: the mux's own answer leaked: %v", c.method, c.path, w.Header())
		}
	}
}

// TestRequestContext: a routed request's context has the deadline of
// Config.Timeout, is done at it once something waits, reports the
// connection's cancellation, and is cancelled once the request is answered,
// as a context.WithTimeout was.
func TestRequestContext(t *testing.T) {
	var got []context.Context
	hold := make(chan struct{})
	s := New(nil, nil, slog.New(slog.DiscardHandler), Config{Timeout: 50 * time.Millisecond})
	s.handle("GET /t/wait", func(w http.ResponseWriter, r *http.Request) error {
		ctx := r.Context()
		got = append(got, ctx)
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > 50*time.Millisecond || time.Until(d) < 0 {
			t.Errorf("deadline %v %v", d, ok)
		}
		child, cancel := context.WithCancel(ctx) // registers, no goroutine
		defer cancel()
		select {
		case <-child.Done():
		case <-time.After(5 * time.Second):
			t.Error("not done at the deadline")
		}
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) || !errors.Is(child.Err(), context.DeadlineExceeded) {
			t.Errorf("err %v, child %v; want DeadlineExceeded", ctx.Err(), child.Err())
		}
		return nil
	})
	s.handle("GET /t/quick", func(w http.ResponseWriter, r *http.Request) error {
		got = append(got, r.Context())
		if err := r.Context().Err(); err != nil {
			t.Errorf("err %v before the deadline", err)
		}
		return nil
	})
	s.handle("GET /t/gone", func(w http.ResponseWriter, r *http.Request) error {
		<-hold
		if !errors.Is(r.Context().Err(), context.Canceled) {
			t.Errorf("err %v after the connection went, want Canceled", r.Context().Err())
		}
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
			t.Error("not done after the connection went")
		}
		return nil
	})
	for _, p := range []string{"/t/wait", "/t/quick"} {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest("GET", p, nil))
		if w.Code != 200 {
			t.Fatalf("%s: %d %s", p, w.Code, w.Body)
		}
	}
	for _, ctx := range got {
		if !errors.Is(ctx.Err(), context.Canceled) && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Errorf("after the answer: err %v, want done", ctx.Err())
		}
		select {
		case <-ctx.Done():
		default:
			t.Error("after the answer: not done")
		}
	}
	conn, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequest("GET", "/t/gone", nil).WithContext(conn)
	cancel()
	close(hold)
	s.ServeHTTP(httptest.NewRecorder(), r)
}

// TestRequestActor: a user route's context names the user as the audit
// trail's actor (orderstore.ActorKey), with the client's address, through
// contexts derived from it and after its timer was made, and whether the
// request came through ServeHTTP or straight to the mux; a route without a
// user names none. Each answer carries an X-Request-Id: the caller's sane
// one, else a new one per request.
func TestRequestActor(t *testing.T) {
	const secret = "actor-secret-of-reasonable-length"
	tok, err := Sign(secret, "alice", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s := New(nil, nil, slog.New(slog.DiscardHandler), Config{Users: NewUserAuth(secret)})
	want := orderstore.Actor{Name: "user:alice", SourceIP: "192.0.2.10"}
	s.handle("POST /t/user", s.user(func(w http.ResponseWriter, r *http.Request) error {
		ctx := r.Context()
		if got := ctx.Value(orderstore.ActorKey{}); got != want {
			t.Errorf("actor %v, want %v", got, want)
		}
		child, cancel := context.WithTimeout(ctx, time.Minute) // makes the request's timer
		defer cancel()
		for _, c := range []context.Context{child, context.WithoutCancel(child)} {
			if got := c.Value(orderstore.ActorKey{}); got != want {
				t.Errorf("derived context: actor %v, want %v", got, want)
			}
		}
		if got := ctx.Value(orderstore.ActorKey{}); got != want {
			t.Errorf("after the timer: actor %v, want %v", got, want)
		}
		if userOf(r) != "alice" || peerIP(r) != "192.0.2.10" {
			t.Errorf("user %q, peer %q", userOf(r), peerIP(r))
		}
		return nil
	}))
	s.handle("GET /t/anon", func(w http.ResponseWriter, r *http.Request) error {
		if got := r.Context().Value(orderstore.ActorKey{}); got != nil {
			t.Errorf("no user: actor %v", got)
		}
		return nil
	})
	ids := map[string]bool{}
	for _, direct := range []bool{false, true} {
		r := httptest.NewRequest("POST", "/t/user", nil)
		r.RemoteAddr = "192.0.2.10:51234"
		r.Header.Set("Authorization", "Bearer "+tok)
		w := httptest.NewRecorder()
		if direct {
			s.mux.ServeHTTP(w, r)
		} else {
			s.ServeHTTP(w, r)
		}
		if w.Code != 200 {
			t.Fatalf("direct %v: %d %s", direct, w.Code, w.Body)
		}
		id := w.Header().Get("X-Request-Id")
		if len(id) != 16 || ids[id] {
			t.Errorf("direct %v: X-Request-Id %q (seen %v)", direct, id, ids)
		}
		ids[id] = true
	}
	r := httptest.NewRequest("GET", "/t/anon", nil)
	r.Header.Set("X-Request-Id", "from-the-gateway")
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Code != 200 || w.Header().Get("X-Request-Id") != "from-the-gateway" {
		t.Errorf("%d, X-Request-Id %q", w.Code, w.Header().Get("X-Request-Id"))
	}
}

// TestOrdersRoute: a purchase reaches the purchase route whether
// ServeHTTP takes it straight (its path exactly /api/v1/orders) or through
// the mux (the same path written otherwise), with the same answer; other
// methods on the path are 405 as before.
func TestOrdersRoute(t *testing.T) {
	var routes []string
	s := New(nil, nil, slog.New(slog.DiscardHandler), Config{
		Users:   NewUserAuth("orders-route-secret"),
		Observe: func(route string, status int, _ time.Duration) { routes = append(routes, route) },
	})
	var want string
	for _, target := range []string{"/api/v1/orders", "/api/v1/orders?x=1", "/api/v1/%6Frders", "http://example.com/api/v1/orders"} {
		routes = routes[:0]
		r := httptest.NewRequest("POST", target, strings.NewReader(`{"sku_id":"a"}`))
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != 401 || len(routes) != 1 || routes[0] != ordersPattern || r.Pattern != ordersPattern {
			t.Errorf("%s: %d %s, routes %q, pattern %q", target, w.Code, w.Body, routes, r.Pattern)
		}
		if want == "" {
			want = w.Body.String()
		} else if w.Body.String() != want {
			t.Errorf("%s: body %s, want %s", target, w.Body, want)
		}
	}
	for _, m := range []string{"GET", "HEAD", "PUT"} {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(m, "/api/v1/orders", nil))
		if w.Code != 405 || w.Header().Get("Allow") != "POST" {
			t.Errorf("%s: %d, Allow %q", m, w.Code, w.Header().Get("Allow"))
		}
	}
}
