package httpapi

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"hash"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/internal/sale"
)

// The user token verifier: HS256 JWTs with golang-jwt/v5's verdicts
// (ParseWithClaims into RegisteredClaims, methods pinned to HS256, exp
// required, the skew as leeway), then a valid user id in "sub".
//
// Every token first passes two checks golang-jwt makes too: at most
// maxToken bytes in three dot-separated segments, and a third segment
// (unpadded base64url, read by encoding/base64 as golang-jwt reads it) that
// is the HMAC-SHA256 of the first two with the secret, compared in constant
// time. With HS256 pinned, that comparison is the only way golang-jwt
// accepts a token, so a forged one is refused here without reading any
// JSON. A signed token then takes one of two paths:
//
//   - the fast path, for the shapes our own Sign and the usual login
//     services write: a header that is one of compactHeaders byte for byte,
//     and claims that readCompact reads (compact JSON, no escapes, the
//     registered claims of the types they have). On these, encoding/json's
//     reading is the bytes as they are, so only exp and nbf are left to
//     check, as golang-jwt checks them;
//   - any other token goes to golang-jwt itself.
//
// FuzzVerifyTokenDifferential holds both paths to golang-jwt. Every failure
// is the same errUnauthenticated: a client learns nothing about which check
// its token failed.

// maxToken bounds a token's length; longer ones are refused unread.
const maxToken = 4096

// tokenVerifier verifies tokens signed with one secret. Its pool keeps
// HMAC-SHA256 states keyed with the secret and the buffers a verification
// decodes into, so the fast path allocates only the subject.
type tokenVerifier struct {
	secret []byte
	skew   time.Duration
	pool   sync.Pool
}

type tokenState struct {
	mac hash.Hash
	sum [sha256.Size]byte
	tok [maxToken]byte         // the token, as bytes (the base64 decoder reads []byte)
	dec [maxToken / 4 * 3]byte // a decoded segment
}

func newTokenVerifier(secret []byte, skew time.Duration) *tokenVerifier {
	v := &tokenVerifier{secret: append([]byte(nil), secret...), skew: skew}
	v.pool.New = func() any { return &tokenState{mac: hmac.New(sha256.New, v.secret)} }
	return v
}

// verify returns tok's subject if golang-jwt accepts tok at now and its
// subject is a valid user id. expired is true only for a token that fails
// on its expiry alone: correctly signed, valid but for exp (so a 401 may
// say "expired" without telling a forger anything).
func (v *tokenVerifier) verify(tok string, now time.Time) (sub string, ok, expired bool) {
	if len(tok) > maxToken {
		return "", false, false
	}
	d1 := strings.IndexByte(tok, '.')
	if d1 < 0 {
		return "", false, false
	}
	d2 := strings.IndexByte(tok[d1+1:], '.') + d1 + 1
	if d2 == d1 || strings.IndexByte(tok[d2+1:], '.') >= 0 {
		return "", false, false
	}
	st := v.pool.Get().(*tokenState)
	defer v.pool.Put(st)
	b := st.tok[:copy(st.tok[:], tok)]
	enc := base64.RawURLEncoding
	n, err := enc.Decode(st.dec[:], b[d2+1:])
	if err != nil {
		return "", false, false
	}
	st.mac.Reset()
	st.mac.Write(b[:d2])
	if !hmac.Equal(st.dec[:n], st.mac.Sum(st.sum[:0])) {
		return "", false, false
	}
	if compactHeader(tok[:d1]) {
		n, err := enc.Decode(st.dec[:], b[d1+1:d2])
		if err != nil {
			return "", false, false
		}
		if c, ok := readCompact(st.dec[:n]); ok {
			sub, ok := c.check(now, v.skew)
			return sub, ok, !ok && c.expiredOnly(now, v.skew)
		}
	}
	return v.verifyJWT(tok, now)
}

// verifyJWT is golang-jwt's verdict on tok at now (see verify).
func (v *tokenVerifier) verifyJWT(tok string, now time.Time) (sub string, ok, expired bool) {
	var c jwt.RegisteredClaims
	_, err := jwt.ParseWithClaims(tok, &c, func(*jwt.Token) (any, error) { return v.secret, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(v.skew),
		jwt.WithTimeFunc(func() time.Time { return now }),
	)
	if err != nil || !sale.ValidUser(c.Subject) {
		expired := errors.Is(err, jwt.ErrTokenExpired) && !errors.Is(err, jwt.ErrTokenSignatureInvalid) &&
			!errors.Is(err, jwt.ErrTokenNotValidYet) && !errors.Is(err, jwt.ErrTokenMalformed) && sale.ValidUser(c.Subject)
		return "", false, expired
	}
	return c.Subject, true, false
}

// compactHeaders are the base64url of the headers the fast path knows:
// golang-jwt's, jsonwebtoken's and PyJWT's ({"alg":"HS256","typ":"JWT"}),
// the same in the other order, and alg alone (jose, jjwt).
var compactHeaders = [...]string{
	"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9",
	"eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1NiJ9",
	"eyJhbGciOiJIUzI1NiJ9",
}

func compactHeader(h string) bool {
	for _, k := range compactHeaders {
		if h == k {
			return true
		}
	}
	return false
}

// compactClaims are the claims the fast path checks.
type compactClaims struct {
	sub            []byte
	exp, nbf       int64 // seconds
	hasExp, hasNbf bool
}

// check is golang-jwt's validation of c at now (exp required, nbf if
// present, each with the leeway skew), then the subject's.
func (c compactClaims) check(now time.Time, skew time.Duration) (string, bool) {
	if !c.hasExp || !now.Before(time.Unix(c.exp, 0).Add(skew)) || c.hasNbf && now.Before(time.Unix(c.nbf, 0).Add(-skew)) {
		return "", false
	}
	sub := string(c.sub)
	if !sale.ValidUser(sub) {
		return "", false
	}
	return sub, true
}

// expiredOnly reports whether c fails check at now on its expiry alone.
func (c compactClaims) expiredOnly(now time.Time, skew time.Duration) bool {
	return c.hasExp && !now.Before(time.Unix(c.exp, 0).Add(skew)) &&
		!(c.hasNbf && now.Before(time.Unix(c.nbf, 0).Add(-skew))) && sale.ValidUser(string(c.sub))
}

// readCompact reads claims b if they have the compact shape, where what
// encoding/json reads into RegisteredClaims is plain: one object, no white
// space; member names of printable ASCII without escapes, a registered
// claim's name (iss, sub, aud, exp, nbf, iat, jti) in lower case and at most
// once; iss, sub, aud and jti strings without escapes (sub in ASCII);
// exp, nbf and iat whole numbers of 1-15 digits (exact in a float64); any
// other member a string without escapes, such a number, true, false or
// null. ok is false for any other claims, which golang-jwt then reads.
func readCompact(b []byte) (c compactClaims, ok bool) {
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' {
		return c, false
	}
	b = b[1 : len(b)-1]
	var seen [7]bool
	for i := 0; i < len(b); {
		if i > 0 {
			if b[i] != ',' {
				return c, false
			}
			i++
		}
		name, n := compactString(b[i:], 0x7f)
		if n == 0 || i+n >= len(b) || b[i+n] != ':' {
			return c, false
		}
		i += n + 1
		claim := registered(name)
		if claim < 0 && len(name) == 3 {
			// encoding/json matches names without regard to case.
			var lower [3]byte
			for k, ch := range name {
				if 'A' <= ch && ch <= 'Z' {
					ch += 'a' - 'A'
				}
				lower[k] = ch
			}
			if registered(lower[:]) >= 0 {
				return c, false
			}
		}
		if claim >= 0 {
			if seen[claim] {
				return c, false
			}
			seen[claim] = true
		}
		limit := byte(0xff) // the string's bytes: any but " and \ (encoding/json ignores it)
		if claim == claimSub {
			limit = 0x7f
		}
		str, n := compactString(b[i:], limit)
		num, m := compactNumber(b[i:])
		switch {
		case claim == claimExp || claim == claimNbf || claim == claimIat:
			if m == 0 {
				return c, false
			}
			switch claim {
			case claimExp:
				c.exp, c.hasExp = num, true
			case claimNbf:
				c.nbf, c.hasNbf = num, true
			}
			i += m
		case n > 0:
			if claim == claimSub {
				c.sub = str
			}
			i += n
		case claim >= 0:
			return c, false
		case m > 0:
			i += m
		default:
			lit := 0
			for _, l := range [...]string{"true", "false", "null"} {
				if bytes.HasPrefix(b[i:], []byte(l)) {
					lit = len(l)
				}
			}
			if lit == 0 {
				return c, false
			}
			i += lit
		}
	}
	return c, true
}

// The registered claims, by index into readCompact's seen.
const (
	claimIss = iota
	claimSub
	claimAud
	claimExp
	claimNbf
	claimIat
	claimJti
)

// registered is the registered claim named name exactly, or -1.
func registered(name []byte) int {
	switch string(name) {
	case "iss":
		return claimIss
	case "sub":
		return claimSub
	case "aud":
		return claimAud
	case "exp":
		return claimExp
	case "nbf":
		return claimNbf
	case "iat":
		return claimIat
	case "jti":
		return claimJti
	}
	return -1
}

// compactString reads a JSON string at the start of b whose bytes are at
// least 0x20, at most limit, and neither '"' nor '\': its contents and its
// length with the quotes (0 if b does not start with one).
func compactString(b []byte, limit byte) (s []byte, n int) {
	if len(b) == 0 || b[0] != '"' {
		return nil, 0
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return b[1:i], i + 1
		case c < 0x20 || c > limit || c == '\\':
			return nil, 0
		}
	}
	return nil, 0
}

// compactNumber reads a whole number of 1-15 digits, without a leading zero
// (but 0), at the start of b: its value and length (0 if there is none).
func compactNumber(b []byte) (v int64, n int) {
	for n < len(b) && '0' <= b[n] && b[n] <= '9' {
		v = v*10 + int64(b[n]-'0')
		n++
		if n > 15 || n == 2 && b[0] == '0' {
			return 0, 0
		}
	}
	if n < len(b) && (b[n] == '.' || b[n] == 'e' || b[n] == 'E') {
		return 0, 0 // a fraction or an exponent
	}
	return v, n
}

// signHS256 mints the token Sign returns: golang-jwt's, with the registered
// claims sub, exp and iat (whole seconds).
func signHS256(secret []byte, sub string, now time.Time, ttl time.Duration) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Subject: sub, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}).SignedString(secret)
}
