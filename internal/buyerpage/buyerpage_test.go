package buyerpage

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHandler: the page at any sale's path, its files beneath the assets
// path with their types, ETags that revalidate, the CSP on every answer,
// and nothing else.
func TestHandler(t *testing.T) {
	h := Handler()
	get := func(path string, hdr ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, c := range []struct {
		path   string
		status int
		ctype  string
		want   string
	}{
		{"/sale/phone-1", 200, "text/html; charset=utf-8", `<altcha-widget`},
		{"/sale/SKU%20with%20space", 200, "text/html; charset=utf-8", `<html lang="en">`},
		{"/sale/assets/app.js", 200, "text/javascript; charset=utf-8", `$altcha.algorithms.set`},
		{"/sale/assets/app.css", 200, "text/css; charset=utf-8", `:focus-visible`},
		{"/sale/assets/vendor/altcha/altcha.min.js", 200, "text/javascript; charset=utf-8", `altcha-widget`},
		{"/sale/assets/vendor/altcha/pbkdf2.js", 200, "text/javascript; charset=utf-8", `deriveKey`},
		{"/sale/assets/vendor/altcha/LICENSE.txt", 200, "text/plain; charset=utf-8", `MIT License`},
		{"/sale/assets/", 404, "application/json; charset=utf-8", `"not_found"`},
		{"/sale/assets/index.html", 404, "", ""},
		{"/sale/assets/../../etc/passwd", 404, "", ""},
		{"/sale/assets/nope.js", 404, "", ""},
	} {
		w := get(c.path)
		if w.Code != c.status || (c.ctype != "" && w.Header().Get("Content-Type") != c.ctype) || !strings.Contains(w.Body.String(), c.want) {
			t.Errorf("GET %s: %d %q, want %d %q with %q", c.path, w.Code, w.Header().Get("Content-Type"), c.status, c.ctype, c.want)
		}
		if got := w.Header().Get("Content-Security-Policy"); got != csp {
			t.Errorf("GET %s: CSP %q", c.path, got)
		}
		if c.status == 200 {
			tag := w.Header().Get("ETag")
			if tag == "" || w.Header().Get("Cache-Control") != "no-cache" {
				t.Errorf("GET %s: ETag %q, Cache-Control %q", c.path, tag, w.Header().Get("Cache-Control"))
			}
			if w := get(c.path, "If-None-Match", tag); w.Code != http.StatusNotModified {
				t.Errorf("GET %s If-None-Match: %d, want 304", c.path, w.Code)
			}
		}
	}
	if !strings.Contains(csp, "worker-src 'self'") || strings.Contains(csp, "unsafe") || strings.Contains(csp, "blob:") {
		t.Errorf("CSP %q: the widget's workers come from this server and nothing inline runs", csp)
	}
}
