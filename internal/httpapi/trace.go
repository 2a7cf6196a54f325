package httpapi

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traced wraps the handler of a route in a server span named after its
// pattern ("POST /api/v1/orders"), continuing the caller's trace when the
// request carries a W3C traceparent. With tracing off it returns h itself:
// nothing is added to the request path.
func (s *Server) traced(pattern string, h http.HandlerFunc) http.HandlerFunc {
	t := s.cfg.Tracer
	if t == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := t.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.Start(ctx, pattern, trace.SpanKindServer)
		defer span.End()
		sw := &spanWriter{ResponseWriter: w, status: http.StatusOK}
		h(sw, r.WithContext(ctx))
		if span.IsRecording() {
			span.SetAttributes(attribute.String("http.route", pattern),
				attribute.String("http.request.method", r.Method),
				attribute.Int("http.response.status_code", sw.status))
			if sw.status >= 500 {
				span.SetStatus(codes.Error, http.StatusText(sw.status))
			}
		}
	}
}

// spanWriter records the status a handler answered.
type spanWriter struct {
	http.ResponseWriter
	status int
}

func (w *spanWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *spanWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
