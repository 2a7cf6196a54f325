package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"testing"
)

// TestDrain: before Begin the wrapped handler answers everything as usual
// (keep-alive kept); after it /readyz answers 503 with the exact draining
// body, and every other request is still served, with Connection: close, so
// the client's next request opens a new connection. Through a real server
// and client: the header is what makes net/http close the connection.
func TestDrain(t *testing.T) {
	ok := func(context.Context) error { return nil }
	d := NewDrain(New(nil, nil, slog.New(slog.DiscardHandler), Config{
		Users: NewUserAuth("secret"), Ready: []Checker{{Name: "db", Critical: true, Check: ok}}}))
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)

	type reply struct {
		code   int
		body   string
		ctype  string
		cache  string
		closed bool // Connection: close
		reused bool // sent on a connection a previous request used
	}
	get := func(path string) reply {
		t.Helper()
		var reused bool
		ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return reply{resp.StatusCode, string(b), resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"), resp.Close, reused}
	}

	get("/healthz") // opens the connection the next requests reuse
	for _, path := range []string{"/readyz", "/healthz"} {
		if got := get(path); got.code != http.StatusOK || got.closed || !got.reused {
			t.Fatalf("before Begin, %s: %+v; want 200 on a kept connection", path, got)
		}
	}

	d.Begin()
	want := reply{code: http.StatusServiceUnavailable, body: `{"status":"draining","ready":false,"checks":{}}` + "\n",
		ctype: "application/json", cache: "no-store", closed: true, reused: true}
	if got := get("/readyz"); got != want {
		t.Fatalf("draining, /readyz:\n got %+v\nwant %+v", got, want)
	}
	// The connection the 503 closed is not reused; this one is served as
	// before, and closed too.
	if got := get("/healthz"); got.code != http.StatusOK || !got.closed || got.reused {
		t.Fatalf("draining, /healthz: %+v; want 200 with Connection: close on a new connection", got)
	}
	if got := get("/api/v1/orders/x"); got.code != http.StatusUnauthorized || !got.closed || got.reused {
		t.Fatalf("draining, an API error: %+v; want the handler's own 401 with Connection: close", got)
	}
}
