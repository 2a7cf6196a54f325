// Package buyerpage is the buyers' page of a sale, /sale/{id}: solves the
// sale's proof-of-work challenge, waits in its room, buys and follows the
// order, through the public API only. HTML, CSS and JavaScript, with the
// ALTCHA widget vendored from npm, are embedded in the binary.
package buyerpage

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// Prefix is the path of the page: Prefix + a SKU id.
const Prefix = "/sale/"

// AssetsPrefix is the path its files are served under.
const AssetsPrefix = "/sale/assets/"

// csp allows only the page's own files, same-origin API calls and the
// widget's workers loaded from this server (worker-src 'self'): the widget
// is the "external" build, whose styles are a file and whose workers are
// registered by app.js, so neither 'unsafe-inline' nor blob: is needed. A
// token pasted into the page can only ever be sent back to this server.
const csp = "default-src 'none'; script-src 'self'; worker-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// Handler serves the page for GET Prefix+{id} (any id: the page reads it
// from its URL and asks the API about it) and its files under
// AssetsPrefix; anything else under AssetsPrefix is 404 not_found, in the
// API's JSON error shape. Each answer
// carries an ETag (the file's hash) and Cache-Control: no-cache, so a
// browser revalidates cheaply and picks up a new binary's page at once. The
// server keeps no state for the page.
func Handler() http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	type file struct {
		body []byte
		etag string
	}
	byName := map[string]file{}
	_ = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		byName[p] = file{b, `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		name := "index.html"
		if rest, ok := strings.CutPrefix(r.URL.Path, AssetsPrefix); ok {
			name = strings.TrimPrefix(path.Clean("/"+rest), "/")
			if name == "index.html" {
				name = "" // the page is served at its own path only
			}
		} else if id := strings.TrimPrefix(r.URL.Path, Prefix); id == "" || strings.Contains(id, "/") {
			name = ""
		}
		f, ok := byName[name]
		if !ok {
			// The API's error shape: clients of this server read one kind.
			h.Set("Content-Type", "application/json; charset=utf-8")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"code":"not_found","message":"no such file"}}`+"\n")
			return
		}
		h.Set("ETag", f.etag)
		// ServeContent answers If-None-Match with 304 and sets the
		// Content-Type from the name.
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.body))
	})
}
