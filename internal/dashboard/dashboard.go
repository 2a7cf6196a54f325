// Package dashboard is the operators' view of an instance's live state: the
// embedded page, the overview it polls, the recent samples its charts draw
// and the same figures as Prometheus gauges.
package dashboard

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed static
var static embed.FS

// Prefix is the path the page is served under.
const Prefix = "/dashboard/"

// csp allows only the page's own files and same-origin API calls: a token
// typed into the page can only ever be sent back to this server.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// Handler serves the page's files for requests under Prefix: HTML, CSS and
// JavaScript embedded in the binary, with no build step and nothing fetched
// from elsewhere. The page polls GET /admin/v1/overview (Live.Overview) and
// calls the admin API with the token the operator types in; the server
// keeps no state for it. Each answer carries an ETag (the file's hash), so
// a browser revalidates cheaply and picks up a new binary's page at once.
func Handler() http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	etags := map[string]string{}
	_ = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		etags["/"+p] = `"` + hex.EncodeToString(sum[:8]) + `"`
		return nil
	})
	fileServer := http.StripPrefix(strings.TrimSuffix(Prefix, "/"), http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		name := path.Clean("/" + strings.TrimPrefix(r.URL.Path, Prefix))
		if name == "/" {
			name = "/index.html"
		}
		if tag, ok := etags[name]; ok {
			h.Set("ETag", tag)
		}
		fileServer.ServeHTTP(w, r)
	})
}
