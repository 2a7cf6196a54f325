package dashboard_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/dashboard"
)

func get(t *testing.T, h http.Handler, path string, header ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func TestServesFiles(t *testing.T) {
	h := dashboard.Handler()
	for _, tc := range []struct {
		path, contentType, contains string
	}{
		{"/dashboard/", "text/html; charset=utf-8", `<script type="module" src="app.js"></script>`},
		{"/dashboard/app.js", "text/javascript; charset=utf-8", `"/admin/v1/overview"`},
		{"/dashboard/chart.js", "text/javascript; charset=utf-8", "export function drawChart("},
		{"/dashboard/app.css", "text/css; charset=utf-8", ":root"},
		{"/dashboard/favicon.svg", "image/svg+xml", "<svg"},
	} {
		resp := get(t, h, tc.path)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", tc.path, resp.StatusCode)
			continue
		}
		if got := resp.Header.Get("Content-Type"); got != tc.contentType {
			t.Errorf("GET %s: Content-Type %q, want %q", tc.path, got, tc.contentType)
		}
		if !strings.Contains(string(body), tc.contains) {
			t.Errorf("GET %s: body lacks %q", tc.path, tc.contains)
		}
		for _, hdr := range []string{"Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy", "ETag"} {
			if resp.Header.Get(hdr) == "" {
				t.Errorf("GET %s: no %s header", tc.path, hdr)
			}
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "connect-src 'self'") || !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("GET %s: CSP %q does not keep scripts and requests on this server", tc.path, csp)
		}
	}
	if resp := get(t, h, "/dashboard/nope.js"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown file: %d, want 404", resp.StatusCode)
	}
}

func TestRevalidation(t *testing.T) {
	h := dashboard.Handler()
	first := get(t, h, "/dashboard/app.js")
	tag := first.Header.Get("ETag")
	if !regexp.MustCompile(`^"[0-9a-f]{16}"$`).MatchString(tag) {
		t.Fatalf("ETag %q", tag)
	}
	if resp := get(t, h, "/dashboard/app.js", "If-None-Match", tag); resp.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match with the current tag: %d, want 304", resp.StatusCode)
	}
	if resp := get(t, h, "/dashboard/app.js", "If-None-Match", `"0000000000000000"`); resp.StatusCode != http.StatusOK {
		t.Errorf("If-None-Match with another tag: %d, want 200", resp.StatusCode)
	}
	if a, b := get(t, h, "/dashboard/").Header.Get("ETag"), get(t, h, "/dashboard/app.css").Header.Get("ETag"); a == b || a == "" {
		t.Errorf("index and stylesheet share the ETag %q", a)
	}
}

// TestSelfContained: the page works without internet access, so nothing in
// it may load from elsewhere, and every file it names is embedded.
func TestSelfContained(t *testing.T) {
	h := dashboard.Handler()
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	for _, name := range []string{"index.html", "app.js", "chart.js", "app.css", "favicon.svg"} {
		body, _ := io.ReadAll(get(t, h, "/dashboard/"+name).Body)
		for _, m := range external.FindAllString(string(body), -1) {
			if m != "http://www.w3.org" { // the SVG namespace, not a request
				t.Errorf("%s refers to %s", name, m)
			}
		}
	}
	index, _ := io.ReadAll(get(t, h, "/dashboard/").Body)
	app, _ := io.ReadAll(get(t, h, "/dashboard/app.js").Body)
	refs := regexp.MustCompile(`(?:src|href)="([^"#]+)"`).FindAllStringSubmatch(string(index), -1)
	refs = append(refs, regexp.MustCompile(`from "\./([^"]+)"`).FindAllStringSubmatch(string(app), -1)...)
	if len(refs) < 4 {
		t.Fatalf("found only %d references in index.html and app.js", len(refs))
	}
	for _, m := range refs {
		if resp := get(t, h, "/dashboard/"+m[1]); resp.StatusCode != http.StatusOK {
			t.Errorf("the page names %s: %d", m[1], resp.StatusCode)
		}
	}
}

// TestTokenNeverInURL: the token input has no name, so even a form that
// submitted without the script could not put it in a query string.
func TestTokenNeverInURL(t *testing.T) {
	index, _ := io.ReadAll(get(t, dashboard.Handler(), "/dashboard/").Body)
	input := regexp.MustCompile(`<input id="token"[^>]*>`).FindString(string(index))
	if input == "" || strings.Contains(input, "name=") || !strings.Contains(input, `type="password"`) {
		t.Errorf("token input %q: want a nameless password field", input)
	}
	if !strings.Contains(string(index), `<form id="token-form" method="post"`) {
		t.Error("the token form does not POST")
	}
}
