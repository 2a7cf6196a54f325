package httpapi

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"

	"github.com/flashsale/flashsale/internal/sale"
)

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// hs256 signs header.payload with HMAC-SHA256 whatever the header says (to
// forge tokens whose header lies about the algorithm).
func hs256(secret, header, payload string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(b64(header) + "." + b64(payload)))
	return b64(header) + "." + b64(payload) + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// TestVerifyTokenHostile: the algorithm is pinned, exp is required and the
// skew bounded, whatever the token's header claims.
func TestVerifyTokenHostile(t *testing.T) {
	const secret = "s3cret"
	now := time.Now()
	a := NewUserAuth(secret)
	exp := now.Add(time.Minute).Unix()
	sign := func(m jwt.SigningMethod, key any, claims jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(m, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	payload := `{"sub":"bob","exp":` + itoa(exp) + `}`
	cases := []struct {
		name, tok string
		ok        bool
	}{
		{"control: HS256 by hand", hs256(secret, `{"alg":"HS256","typ":"JWT"}`, payload), true},
		{"alg none, unsigned", b64(`{"alg":"none","typ":"JWT"}`) + "." + b64(payload) + ".", false},
		{"alg None, unsigned", b64(`{"alg":"None"}`) + "." + b64(payload) + ".", false},
		{"alg none, HMAC signature", hs256(secret, `{"alg":"none"}`, payload), false},
		{"alg RS256 header, HMAC with the secret (key confusion)", hs256(secret, `{"alg":"RS256"}`, payload), false},
		{"alg HS384 header, HS256 signature", hs256(secret, `{"alg":"HS384"}`, payload), false},
		{"no alg", hs256(secret, `{"typ":"JWT"}`, payload), false},
		{"RS256 signed", sign(jwt.SigningMethodRS256, rsaKey, jwt.MapClaims{"sub": "bob", "exp": exp}), false},
		{"HS384 signed with the secret", sign(jwt.SigningMethodHS384, []byte(secret), jwt.MapClaims{"sub": "bob", "exp": exp}), false},
		{"empty secret", sign(jwt.SigningMethodHS256, []byte(""), jwt.MapClaims{"sub": "bob", "exp": exp}), false},
		// The library reads a quoted number as a date too; it still bounds the token.
		{"exp as a string, in the past", hs256(secret, `{"alg":"HS256"}`, `{"sub":"bob","exp":"`+itoa(now.Add(-time.Hour).Unix())+`"}`), false},
		{"exp not a number", hs256(secret, `{"alg":"HS256"}`, `{"sub":"bob","exp":"soon"}`), false},
		{"exp null", hs256(secret, `{"alg":"HS256"}`, `{"sub":"bob","exp":null}`), false},
		{"expired 20s ago (within the 30s skew)", sign(jwt.SigningMethodHS256, []byte(secret), jwt.MapClaims{"sub": "bob", "exp": now.Add(-20 * time.Second).Unix()}), true},
		{"expired 40s ago (beyond the skew)", sign(jwt.SigningMethodHS256, []byte(secret), jwt.MapClaims{"sub": "bob", "exp": now.Add(-40 * time.Second).Unix()}), false},
		{"nbf in 20s (within the skew)", sign(jwt.SigningMethodHS256, []byte(secret), jwt.MapClaims{"sub": "bob", "exp": exp, "nbf": now.Add(20 * time.Second).Unix()}), true},
		{"nbf in 40s (beyond the skew)", sign(jwt.SigningMethodHS256, []byte(secret), jwt.MapClaims{"sub": "bob", "exp": exp, "nbf": now.Add(40 * time.Second).Unix()}), false},
		{"sub 129 characters", sign(jwt.SigningMethodHS256, []byte(secret), jwt.MapClaims{"sub": strings.Repeat("b", 129), "exp": exp}), false},
		{"sub with NUL", sign(jwt.SigningMethodHS256, []byte(secret), jwt.MapClaims{"sub": "bob\x00alice", "exp": exp}), false},
		{"sub a number", hs256(secret, `{"alg":"HS256"}`, `{"sub":42,"exp":`+itoa(exp)+`}`), false},
		{"signature stripped", strings.Join(strings.Split(hs256(secret, `{"alg":"HS256"}`, payload), ".")[:2], ".") + ".", false},
		{"two tokens joined", hs256(secret, `{"alg":"HS256"}`, payload) + "." + hs256(secret, `{"alg":"HS256"}`, payload), false},
		{"padding in base64", hs256(secret, `{"alg":"HS256"}`, payload) + "==", false},
	}
	for _, c := range cases {
		u, err := a.Verify(c.tok)
		if c.ok && (err != nil || u != "bob") {
			t.Errorf("%s: refused (%v), want bob", c.name, err)
		}
		if !c.ok && err == nil {
			t.Errorf("%s: accepted as %q", c.name, u)
		}
		if err != nil && !errors.Is(err, errUnauthenticated) {
			t.Errorf("%s: error %v is not errUnauthenticated", c.name, err)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func request(remote string, headers ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/api/v1/orders", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

// TestTrustedGateway: the user header is believed only from a trusted
// proxy, only when it holds exactly one valid user id; everyone else needs
// a token, and the mode is off unless configured.
func TestTrustedGateway(t *testing.T) {
	const secret = "k"
	tok, _ := Sign(secret, "tokenuser", time.Minute)
	proxies, err := ParseProxies("10.0.0.0/8, 192.0.2.7")
	if err != nil {
		t.Fatal(err)
	}
	plain := NewUserAuth(secret)
	gw := plain.WithGateway("x-user-id", proxies)
	cases := []struct {
		name string
		auth *UserAuth
		r    *http.Request
		want string // "" = refused
	}{
		{"off: header ignored", plain, request("10.1.2.3:5000", "X-User-Id", "alice"), ""},
		{"off: token", plain, request("10.1.2.3:5000", "X-User-Id", "alice", "Authorization", "Bearer "+tok), "tokenuser"},
		{"trusted peer", gw, request("10.1.2.3:5000", "X-User-Id", "alice"), "alice"},
		{"trusted single address", gw, request("192.0.2.7:5000", "X-User-Id", "alice"), "alice"},
		{"trusted peer over the token", gw, request("10.1.2.3:5000", "X-User-Id", "alice", "Authorization", "Bearer "+tok), "alice"},
		{"trusted peer, no header: token", gw, request("10.1.2.3:5000", "Authorization", "Bearer "+tok), "tokenuser"},
		{"trusted peer, bad user id", gw, request("10.1.2.3:5000", "X-User-Id", "alice bob"), ""},
		{"trusted peer, empty user id", gw, request("10.1.2.3:5000", "X-User-Id", ""), ""},
		{"trusted peer, two user ids", gw, request("10.1.2.3:5000", "X-User-Id", "alice", "X-User-Id", "bob"), ""},
		{"untrusted peer: header ignored", gw, request("192.0.2.8:5000", "X-User-Id", "alice"), ""},
		{"untrusted peer: token still works", gw, request("192.0.2.8:5000", "X-User-Id", "alice", "Authorization", "Bearer "+tok), "tokenuser"},
		{"untrusted peer claiming a trusted X-Forwarded-For", gw, request("192.0.2.8:5000", "X-User-Id", "alice", "X-Forwarded-For", "10.0.0.1"), ""},
		{"IPv4-mapped trusted peer", gw, request("[::ffff:10.1.2.3]:5000", "X-User-Id", "alice"), "alice"},
		{"unparsable peer", gw, request("garbage", "X-User-Id", "alice"), ""},
		{"no proxies: mode off", plain.WithGateway("X-User-Id", nil), request("10.1.2.3:5000", "X-User-Id", "alice"), ""},
	}
	for _, c := range cases {
		u, err := c.auth.User(c.r)
		if c.want == "" && err == nil {
			t.Errorf("%s: accepted as %q", c.name, u)
		}
		if c.want != "" && (err != nil || u != c.want) {
			t.Errorf("%s: got %q %v, want %q", c.name, u, err, c.want)
		}
	}
}

func TestClientIP(t *testing.T) {
	proxies, err := ParseProxies("10.0.0.0/8,2001:db8:ffff::/48 192.0.2.7")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		proxies *Proxies
		r       *http.Request
		want    string
	}{
		{"no proxies: peer", nil, request("198.51.100.1:1", "X-Forwarded-For", "1.2.3.4"), "198.51.100.1"},
		{"untrusted peer: XFF ignored", proxies, request("198.51.100.1:1", "X-Forwarded-For", "1.2.3.4"), "198.51.100.1"},
		{"trusted peer: client from XFF", proxies, request("10.0.0.1:1", "X-Forwarded-For", "203.0.113.9"), "203.0.113.9"},
		{"spoofed entries left of the real one", proxies, request("10.0.0.1:1", "X-Forwarded-For", "1.1.1.1, 2.2.2.2, 203.0.113.9"), "203.0.113.9"},
		{"chain of trusted proxies", proxies, request("10.0.0.1:1", "X-Forwarded-For", "203.0.113.9, 10.9.9.9, 192.0.2.7"), "203.0.113.9"},
		{"several XFF headers", proxies, request("10.0.0.1:1", "X-Forwarded-For", "1.1.1.1", "X-Forwarded-For", "203.0.113.9, 10.2.2.2"), "203.0.113.9"},
		{"all trusted: leftmost", proxies, request("10.0.0.1:1", "X-Forwarded-For", "10.3.3.3, 10.2.2.2"), "10.3.3.3"},
		{"no XFF: the proxy", proxies, request("10.0.0.1:1"), "10.0.0.1"},
		{"garbage entry: last trusted hop", proxies, request("10.0.0.1:1", "X-Forwarded-For", "203.0.113.9, bogus, 10.2.2.2"), "10.2.2.2"},
		{"garbage rightmost: the peer", proxies, request("10.0.0.1:1", "X-Forwarded-For", "'; DROP TABLE orders"), "10.0.0.1"},
		{"entry with port", proxies, request("10.0.0.1:1", "X-Forwarded-For", "203.0.113.9:4711"), "203.0.113.9"},
		{"IPv6 peer and client", proxies, request("[2001:db8:ffff::1]:443", "X-Forwarded-For", "2001:db8:1::5"), "2001:db8:1::5"},
		{"IPv6 client with port", proxies, request("10.0.0.1:1", "X-Forwarded-For", "[2001:db8:1::5]:443"), "2001:db8:1::5"},
		{"IPv4-mapped", proxies, request("[::ffff:10.0.0.1]:1", "X-Forwarded-For", "::ffff:203.0.113.9"), "203.0.113.9"},
		// The peer's address as netip writes it, whatever RemoteAddr's spelling.
		{"peer without port", nil, request("198.51.100.1"), "198.51.100.1"},
		{"IPv6 peer", nil, request("[2001:DB8:0::1]:443"), "2001:db8::1"},
		{"IPv6 peer without port", nil, request("2001:db8::1"), "2001:db8::1"},
		{"IPv6 peer, non-canonical, without port", nil, request("2001:DB8::1"), "2001:db8::1"},
		{"IPv4-mapped peer", nil, request("[::ffff:198.51.100.1]:1"), "198.51.100.1"},
		{"peer with a longer prefix", nil, request("198.51.100.10:1"), "198.51.100.10"},
	}
	for _, c := range cases {
		if got := c.proxies.ClientIP(c.r); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "fe80::1%eth0", "host.example", "10.0.0.1/8/9"} {
		if _, err := ParseProxies(bad); err == nil {
			t.Errorf("ParseProxies(%q) accepted", bad)
		}
	}
	if p, err := ParseProxies(" , "); p != nil || err != nil {
		t.Errorf("empty list: %v %v, want nil", p, err)
	}
}

// TestRateLimitedAnswer: 429 rate_limited with a Retry-After in whole
// seconds, rounded up; the instance limiter answers before the handler runs.
func TestRateLimitedAnswer(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&sale.RateLimitError{Scope: "user", RetryAfter: 1500 * time.Millisecond}, "2"},
		{&sale.RateLimitError{Scope: "sku", RetryAfter: time.Millisecond}, "1"},
		{&sale.RateLimitError{Scope: "ip", RetryAfter: 3 * time.Second}, "3"},
		{sale.ErrRateLimited, "1"},
	} {
		w := httptest.NewRecorder()
		writeError(w, request("192.0.2.1:1"), slog.New(slog.DiscardHandler), c.err)
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != c.want || !strings.Contains(w.Body.String(), `"rate_limited"`) {
			t.Errorf("%v: %d Retry-After %q %s, want 429 %s", c.err, w.Code, w.Header().Get("Retry-After"), w.Body, c.want)
		}
	}

	s := &Server{cfg: Config{Limiter: rate.NewLimiter(rate.Every(time.Hour), 2)}}
	ran := 0
	h := s.limited(func(http.ResponseWriter, *http.Request) error { ran++; return nil })
	var errs []error
	for i := 0; i < 5; i++ {
		errs = append(errs, h(httptest.NewRecorder(), request("192.0.2.1:1")))
	}
	if ran != 2 || errs[1] != nil || !errors.Is(errs[2], sale.ErrRateLimited) {
		t.Fatalf("ran %d times, errors %v; want 2 then rate limited", ran, errs)
	}
}
