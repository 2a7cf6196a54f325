package httpapi

import (
	"log/slog"
	"net/http"
	"net/http/pprof"
)

// Profiler returns the Go runtime's profiling endpoints (net/http/pprof)
// under /debug/pprof/, for a listener of their own, never the API's. Every
// request needs the admin token (Authorization: Bearer <token>): profiles
// show goroutine stacks and /debug/pprof/cmdline the command line, flags
// and all. With an empty token every request is refused (403
// admin_disabled).
func Profiler(adminToken string, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := adminOK(r, adminToken); err != nil {
			writeError(w, r, log, err)
			return
		}
		mux.ServeHTTP(w, r)
	})
}
