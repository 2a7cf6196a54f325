package httpapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

// errUnauthenticated is returned when a request carries no valid credentials.
var errUnauthenticated = errors.New("unauthenticated")

// errNoCredentials is the errUnauthenticated of a request with no bearer
// token at all (RFC 6750: its WWW-Authenticate names no error).
var errNoCredentials = fmt.Errorf("%w: no credentials", errUnauthenticated)

// errTokenExpired is the errUnauthenticated of a token that is correctly
// signed and well formed but past its exp: only the holder of a token the
// secret signed learns this, so saying it leaks nothing, and tells the
// client to get a new token rather than look for a bug.
var errTokenExpired = &publicError{base: errUnauthenticated, msg: "The token has expired; get a new one."}

// wwwAuthenticate is the WWW-Authenticate header of a 401 for err (RFC
// 6750 section 3): the scheme alone for a request without credentials,
// invalid_token with the reason in one of two words otherwise (expired, or
// not valid: which check a forged or garbled token failed is not said).
func wwwAuthenticate(err error) string {
	switch {
	case errors.Is(err, errNoCredentials):
		return `Bearer realm="flashsale"`
	case errors.Is(err, errTokenExpired):
		return `Bearer realm="flashsale", error="invalid_token", error_description="The token has expired"`
	}
	return `Bearer realm="flashsale", error="invalid_token", error_description="The token is not valid"`
}

// errAdminDisabled is returned for admin routes when no admin token is configured.
var errAdminDisabled = errors.New("admin api disabled")

// UserAuth verifies user tokens: JWTs signed with HS256 (the algorithm is
// pinned: a token signed any other way, or "none", is refused), with "exp"
// required, a bounded clock skew, and the user id in "sub".
//
// In trusted-gateway mode (WithGateway) a request whose socket peer is a
// trusted proxy may instead name its user in a header the gateway sets
// after authenticating the user itself; from any other peer the header is
// ignored and a token is required.
type UserAuth struct {
	secret  []byte
	tokens  *tokenVerifier   // jwt.go
	now     func() time.Time // the clock, if not the request's (tests)
	header  string
	proxies *Proxies
}

// NewUserAuth returns a verifier for tokens signed with secret.
func NewUserAuth(secret string) *UserAuth {
	return &UserAuth{secret: []byte(secret), tokens: newTokenVerifier([]byte(secret), 30*time.Second)}
}

// WithGateway returns a copy of a that takes the user id from header on
// requests whose socket peer is in proxies (trusted-gateway mode). The
// gateway must authenticate the user and overwrite the header on every
// request it forwards; anyone else able to connect from inside proxies can
// act as any user. An empty header or no proxies leaves the mode off.
func (a *UserAuth) WithGateway(header string, proxies *Proxies) *UserAuth {
	b := *a
	b.header, b.proxies = "", nil
	if header != "" && proxies != nil {
		b.header, b.proxies = http.CanonicalHeaderKey(header), proxies
	}
	return &b
}

// User returns the user id of a request: from the trusted gateway's header
// (gateway mode, peer trusted, header present: exactly one valid user id),
// otherwise from its bearer token.
func (a *UserAuth) User(r *http.Request) (string, error) {
	if a.header != "" && a.proxies.PeerTrusted(r) {
		if vs := r.Header.Values(a.header); len(vs) > 0 {
			if len(vs) != 1 || !sale.ValidUser(vs[0]) {
				return "", errUnauthenticated
			}
			return vs[0], nil
		}
	}
	tok, ok := bearer(r)
	if !ok {
		return "", errNoCredentials
	}
	if len(a.secret) == 0 {
		return "", errUnauthenticated
	}
	now := requestTime(r)
	if a.now != nil {
		now = a.now()
	}
	return a.verify(tok, now)
}

// Verify checks a token and returns its subject (jwt.go says exactly what
// passes). An empty secret verifies nothing.
func (a *UserAuth) Verify(tok string) (string, error) {
	now := time.Now()
	if a.now != nil {
		now = a.now()
	}
	return a.verify(tok, now)
}

// verify is Verify at now.
func (a *UserAuth) verify(tok string, now time.Time) (string, error) {
	if len(a.secret) == 0 {
		return "", errUnauthenticated
	}
	sub, ok, expired := a.tokens.verify(tok, now)
	switch {
	case expired:
		return "", errTokenExpired
	case !ok:
		return "", errUnauthenticated
	}
	return sub, nil
}

// Sign issues a user token for sub valid for ttl (used by the token
// subcommand, the demo and tests; production tokens come from your login service).
func Sign(secret, sub string, ttl time.Duration) (string, error) {
	return signHS256([]byte(secret), sub, time.Now(), ttl)
}

// adminOK compares a request's bearer token with the admin token in constant time.
func adminOK(r *http.Request, token string) error {
	if token == "" {
		return errAdminDisabled
	}
	got, ok := bearer(r)
	if !ok {
		return errNoCredentials
	}
	if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
		return errUnauthenticated
	}
	return nil
}

func bearer(r *http.Request) (string, bool) {
	h := headerValue(r.Header, "Authorization")
	const p = "Bearer "
	if len(h) <= len(p) || !strings.EqualFold(h[:len(p)], p) {
		return "", false
	}
	return strings.TrimSpace(h[len(p):]), true
}

// validSignature checks header "sha256=<hex>" against HMAC-SHA256(secret, body).
func validSignature(secret string, body []byte, header string) bool {
	sig, ok := strings.CutPrefix(header, "sha256=")
	if !ok {
		return false
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return false
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return hmac.Equal(got, m.Sum(nil))
}

// SignPayment returns the X-Flashsale-Signature value of a callback body.
func SignPayment(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}
