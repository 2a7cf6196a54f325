//go:build unix && altcha_widget

package altcha

import (
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestWidgetInChromium has the real widget (testdata/node_modules/altcha,
// installed as gen.mjs says) solve, in headless Chromium, challenges made
// here with the default costs, and verifies its payloads here, logging the
// widget's solving time (the figures of docs/altcha.md). A reproduction of
// those figures, not part of make test (it needs the npm widget installed):
// ALTCHA_CHROMIUM=chromium go test -tags altcha_widget -run TestWidgetInChromium ./internal/altcha/
func TestWidgetInChromium(t *testing.T) {
	browser := os.Getenv("ALTCHA_CHROMIUM")
	if browser == "" {
		browser = "chromium"
	}
	widget := filepath.Join("testdata", "node_modules", "altcha", "dist", "main", "altcha.js")
	if _, err := os.Stat(widget); err != nil {
		t.Fatalf("the widget is not installed (cd internal/altcha/testdata && npm install --no-package-lock): %v", err)
	}
	s := newIssuer(t)
	bound := map[string]string{"buyer": "buyer-42", "sku": `SKU "1" <&>~*+`}
	for _, o := range []Options{{Params: bound}, {Algorithm: AlgorithmSHA256, Params: bound}, {V1: true, Params: bound}} {
		o.Expires = time.Now().Add(2 * time.Minute)
		t.Run(fmt.Sprintf("V1=%v %s", o.V1, o.Algorithm), func(t *testing.T) {
			payloads := make(chan string, 1)
			mux := http.NewServeMux()
			mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, `<!doctype html><form><altcha-widget challenge="/challenge" auto="onload"></altcha-widget></form>
<script type="module" src="/altcha.js"></script>
<script>
const w = document.querySelector('altcha-widget');
w.addEventListener('verified', (e) => fetch('/payload', {method: 'POST', body: e.detail.payload}));
w.addEventListener('statechange', (e) => fetch('/log', {method: 'POST', body: e.detail.state}));
</script>`)
			})
			mux.HandleFunc("/altcha.js", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/javascript")
				http.ServeFile(w, r, widget)
			})
			mux.HandleFunc("/challenge", func(w http.ResponseWriter, r *http.Request) {
				c, err := s.Create(o)
				if err != nil {
					t.Error(err)
				}
				w.Header().Set("Content-Type", "application/json")
				w.Write(c)
			})
			mux.HandleFunc("/log", func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				t.Logf("widget state %s", b)
			})
			mux.HandleFunc("/payload", func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				select {
				case payloads <- string(b):
				default:
				}
			})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: mux}
			go srv.Serve(ln)
			defer srv.Close()
			profile, err := os.MkdirTemp("", "altcha-chromium-")
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--user-data-dir="+profile,
				"--remote-debugging-port=0", "http://"+ln.Addr().String()+"/")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its own group, to end its helpers too
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				cmd.Wait()
				for i := 0; i < 50 && os.RemoveAll(profile) != nil; i++ { // helpers may still be exiting
					time.Sleep(100 * time.Millisecond)
				}
			}()
			select {
			case p := <-payloads:
				r, err := s.Verify(p, time.Now())
				if err != nil {
					t.Fatalf("Verify(%s): %v", p, err)
				}
				raw, _ := base64.StdEncoding.DecodeString(p)
				t.Logf("verified %+v\npayload %s", r, raw)
			case <-time.After(90 * time.Second):
				t.Fatal("the widget submitted no payload in 90 s")
			}
		})
	}
}
