package httpapi

import (
	"errors"
	"net/http"
)

// MaxHeaderBytes is the most a request's line and headers may take: a
// larger request is answered 431 header_too_large in JSON, like every other
// refusal. The server's own limit (ServerMaxHeaderBytes, for
// http.Server.MaxHeaderBytes) lies above it, so that net/http's plain-text
// 431 only meets requests far past this one.
const MaxHeaderBytes = 16 << 10

// ServerMaxHeaderBytes is the http.Server.MaxHeaderBytes to serve the API
// with: past MaxHeaderBytes with room for the JSON answer, and bounded, so
// a client cannot make the server buffer much more (net/http itself reads
// up to 4 KiB beyond it).
const ServerMaxHeaderBytes = 64 << 10

var errHeaderTooLarge = errors.New("request header too large")

// headerBytes is the size of r's request line and headers as the client
// sent them (each line with its CRLF; Host, which net/http moves out of
// Header, included).
func headerBytes(r *http.Request) int {
	n := len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + 2
	if r.Host != "" {
		n += len("Host: ") + len(r.Host) + 2
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + 2 + len(v) + 2
		}
	}
	return n
}
