package httpapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"hash"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The user token verifier: HS256 JWTs checked without reflection or maps.
//
// It accepts exactly the tokens golang-jwt/v5 (ParseWithClaims into
// RegisteredClaims with the methods pinned to HS256, exp required and a
// leeway) accepted, which a differential fuzz test holds it to
// (FuzzVerifyTokenDifferential):
//
//   - exactly three dot-separated segments, each unpadded base64url (the
//     decoder of encoding/base64: line breaks skipped, loose trailing bits);
//   - the header a JSON object whose last "alg" member is the string
//     "HS256" (any other members, any JSON, numbers within float64);
//   - the signature HMAC-SHA256 of "header.claims" with the secret,
//     compared in constant time;
//   - the claims a JSON object as encoding/json matches it to the
//     registered claims (member names folded as it folds them; unknown
//     members ignored; null leaves a string claim as it was and clears a
//     date): iss, sub, jti strings; aud a string or an array of strings;
//     exp, nbf, iat numbers or strings holding a JSON number, within
//     float64; exp present and not past (now < exp + skew), nbf, if
//     present, reached (now >= nbf - skew).
//
// Every failure is the same errUnauthenticated: a client learns nothing
// about which check its token failed.

// maxToken bounds a token's length; longer ones are refused unread.
const maxToken = 4096

// macPool keeps HMAC-SHA256 states keyed with one secret, and the buffers a
// verification decodes into, so a verification allocates nothing.
type macPool struct{ p sync.Pool }

type macState struct {
	mac hash.Hash
	sum [sha256.Size]byte
	tok [maxToken]byte         // the token, as bytes (the base64 decoder reads []byte)
	dec [maxToken / 4 * 3]byte // a decoded segment
}

func newMacPool(secret []byte) *macPool {
	key := append([]byte(nil), secret...)
	mp := &macPool{}
	mp.p.New = func() any { return &macState{mac: hmac.New(sha256.New, key)} }
	return mp
}

// tokenClaims are the claims verifyHS256 returns.
type tokenClaims struct {
	sub      string
	exp, nbf time.Time
	hasExp   bool
	hasNbf   bool
}

// verifyHS256 checks tok's form, header and signature and returns its
// claims (not yet checked against the clock).
func (mp *macPool) verifyHS256(tok string) (tokenClaims, bool) {
	if len(tok) > maxToken {
		return tokenClaims{}, false
	}
	d1 := indexByte(tok, 0)
	if d1 < 0 {
		return tokenClaims{}, false
	}
	d2 := indexByte(tok, d1+1)
	if d2 < 0 || indexByte(tok, d2+1) >= 0 {
		return tokenClaims{}, false
	}
	st := mp.p.Get().(*macState)
	defer mp.p.Put(st)
	b := st.tok[:copy(st.tok[:], tok)]
	enc := base64.RawURLEncoding
	// The usual header (golang-jwt's and Sign's) is known good; any
	// other is decoded and checked.
	if tok[:d1] != hs256Header {
		n, err := enc.Decode(st.dec[:], b[:d1])
		if err != nil || !headerIsHS256(st.dec[:n]) {
			return tokenClaims{}, false
		}
	}
	// The signature before the claims: a forged token reads no further.
	n, err := enc.Decode(st.dec[:], b[d2+1:])
	if err != nil {
		return tokenClaims{}, false
	}
	st.mac.Reset()
	st.mac.Write(b[:d2])
	if !hmac.Equal(st.dec[:n], st.mac.Sum(st.sum[:0])) {
		return tokenClaims{}, false
	}
	n, err = enc.Decode(st.dec[:], b[d1+1:d2])
	if err != nil {
		return tokenClaims{}, false
	}
	return parseClaims(st.dec[:n])
}

// indexByte is the index of the first '.' in s at or after from, or -1.
func indexByte(s string, from int) int {
	if i := strings.IndexByte(s[from:], '.'); i >= 0 {
		return from + i
	}
	return -1
}

// hs256Header is the base64url of {"alg":"HS256","typ":"JWT"}.
const hs256Header = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"

// headerIsHS256 reports whether b is a JSON object whose last "alg" member
// is the string "HS256" and whose numbers all fit a float64 (encoding/json
// refuses to decode the header into a map otherwise).
func headerIsHS256(b []byte) bool {
	l := lexer{b: b}
	l.space()
	if !l.eat('{') {
		return false
	}
	alg := false
	l.space()
	if l.eat('}') {
		return false // no alg
	}
	for {
		l.space()
		ks, ke, ok := l.str()
		if !ok {
			return false
		}
		var kb [12]byte
		key, fits := unquote(kb[:0], b[ks:ke], 8)
		l.space()
		if !l.eat(':') {
			return false
		}
		l.space()
		if fits && string(key) == "alg" {
			alg = false
			if l.peek() == '"' {
				vs, ve, ok := l.str()
				if !ok {
					return false
				}
				var vb [12]byte
				v, fits := unquote(vb[:0], b[vs:ve], 8)
				alg = fits && string(v) == "HS256"
			} else if !l.value(0, true) {
				return false
			}
		} else if !l.value(0, true) {
			return false
		}
		l.space()
		if l.eat('}') {
			return alg && l.end()
		}
		if !l.eat(',') {
			return false
		}
	}
}

// The registered claims, by their names as encoding/json folds them.
const (
	claimOther = iota
	claimString
	claimSub
	claimAud
	claimExp
	claimNbf
	claimIat
)

func claimOf(key []byte) int {
	switch string(key) { // the names as written, before folding
	case "sub":
		return claimSub
	case "exp":
		return claimExp
	case "iat":
		return claimIat
	case "nbf":
		return claimNbf
	}
	var f [3]byte // the folded name, if three runes that fold to ASCII
	n := 0
	for i := 0; i < len(key); {
		r, size := rune(key[i]), 1
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRune(key[i:])
			r = foldRune(r)
		} else if 'a' <= r && r <= 'z' {
			r -= 'a' - 'A'
		}
		i += size
		if n == len(f) || r >= utf8.RuneSelf {
			return claimOther
		}
		f[n] = byte(r)
		n++
	}
	if n != 3 {
		return claimOther
	}
	switch string(f[:]) {
	case "ISS", "JTI":
		return claimString
	case "SUB":
		return claimSub
	case "AUD":
		return claimAud
	case "EXP":
		return claimExp
	case "NBF":
		return claimNbf
	case "IAT":
		return claimIat
	}
	return claimOther
}

// foldRune is encoding/json's: the smallest rune of r's fold set.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// parseClaims reads the claims object b.
func parseClaims(b []byte) (tokenClaims, bool) {
	var c tokenClaims
	var sub []byte
	var subBuf [132]byte
	l := lexer{b: b}
	l.space()
	if !l.eat('{') {
		return c, false
	}
	l.space()
	if l.eat('}') {
		return c, l.end()
	}
	for {
		l.space()
		ks, ke, ok := l.str()
		if !ok {
			return c, false
		}
		var kb [16]byte // three runes (12 bytes) at most name a claim
		key, fits := unquote(kb[:0], b[ks:ke], 12)
		kind := claimOther
		if fits {
			kind = claimOf(key)
		}
		l.space()
		if !l.eat(':') {
			return c, false
		}
		l.space()
		switch {
		case kind == claimOther:
			if !l.value(0, false) {
				return c, false
			}
		case l.null():
			switch kind {
			case claimExp:
				c.hasExp = false
			case claimNbf:
				c.hasNbf = false
			}
		case kind == claimString || kind == claimSub:
			vs, ve, ok := l.str()
			if !ok {
				return c, false
			}
			if kind == claimSub {
				sub, _ = unquote(subBuf[:0], b[vs:ve], -1)
			}
		case kind == claimAud:
			if !l.audience() {
				return c, false
			}
		default: // a date
			t, ok := l.numericDate()
			if !ok {
				return c, false
			}
			switch kind {
			case claimExp:
				c.exp, c.hasExp = t, true
			case claimNbf:
				c.nbf, c.hasNbf = t, true
			}
		}
		l.space()
		if l.eat('}') {
			if !l.end() {
				return c, false
			}
			c.sub = string(sub)
			return c, true
		}
		if !l.eat(',') {
			return c, false
		}
	}
}

// lexer walks a JSON document, refusing what encoding/json's scanner refuses.
type lexer struct {
	b []byte
	i int
}

func (l *lexer) space() {
	for l.i < len(l.b) {
		switch l.b[l.i] {
		case ' ', '\t', '\n', '\r':
			l.i++
		default:
			return
		}
	}
}

func (l *lexer) peek() byte {
	if l.i < len(l.b) {
		return l.b[l.i]
	}
	return 0
}

func (l *lexer) eat(c byte) bool {
	if l.i < len(l.b) && l.b[l.i] == c {
		l.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (l *lexer) end() bool {
	l.space()
	return l.i == len(l.b)
}

func (l *lexer) literal(s string) bool {
	if len(l.b)-l.i >= len(s) && string(l.b[l.i:l.i+len(s)]) == s {
		l.i += len(s)
		return true
	}
	return false
}

// null consumes a null literal if one is next.
func (l *lexer) null() bool { return l.literal("null") }

// str consumes a string and returns the span of its contents.
func (l *lexer) str() (start, end int, ok bool) {
	if !l.eat('"') {
		return 0, 0, false
	}
	start = l.i
	for l.i < len(l.b) {
		c := l.b[l.i]
		switch {
		case c == '"':
			l.i++
			return start, l.i - 1, true
		case c < 0x20:
			return 0, 0, false
		case c == '\\':
			l.i++
			if l.i >= len(l.b) {
				return 0, 0, false
			}
			switch l.b[l.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				l.i++
			case 'u':
				l.i++
				if len(l.b)-l.i < 4 {
					return 0, 0, false
				}
				for k := 0; k < 4; k++ {
					if hexVal(l.b[l.i+k]) < 0 {
						return 0, 0, false
					}
				}
				l.i += 4
			default:
				return 0, 0, false
			}
		default:
			l.i++
		}
	}
	return 0, 0, false
}

// number consumes a number and returns its span.
func (l *lexer) number() (start, end int, ok bool) {
	start = l.i
	if !validNumberAt(l.b, &l.i) {
		return 0, 0, false
	}
	return start, l.i, true
}

// validNumberAt consumes the longest JSON number at b[*i:], reporting
// whether there is one.
func validNumberAt(b []byte, i *int) bool {
	j := *i
	digits := func() int {
		k := j
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			j++
		}
		return j - k
	}
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && '1' <= b[j] && b[j] <= '9':
		digits()
	default:
		return false
	}
	if j < len(b) && b[j] == '.' {
		j++
		if digits() == 0 {
			return false
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if digits() == 0 {
			return false
		}
	}
	*i = j
	return true
}

// isValidNumber reports whether s is exactly one JSON number.
func isValidNumber(s []byte) bool {
	i := 0
	return validNumberAt(s, &i) && i == len(s)
}

// fitsFloat reports whether the number literal s decodes into a float64.
func fitsFloat(s []byte) bool {
	_, err := strconv.ParseFloat(string(s), 64)
	return err == nil
}

// value consumes any JSON value; with floats, every number in it must fit
// a float64.
func (l *lexer) value(depth int, floats bool) bool {
	if depth > 10000 {
		return false
	}
	switch c := l.peek(); {
	case c == '"':
		_, _, ok := l.str()
		return ok
	case c == '{':
		l.i++
		l.space()
		if l.eat('}') {
			return true
		}
		for {
			l.space()
			if _, _, ok := l.str(); !ok {
				return false
			}
			l.space()
			if !l.eat(':') {
				return false
			}
			l.space()
			if !l.value(depth+1, floats) {
				return false
			}
			l.space()
			if l.eat('}') {
				return true
			}
			if !l.eat(',') {
				return false
			}
		}
	case c == '[':
		l.i++
		l.space()
		if l.eat(']') {
			return true
		}
		for {
			l.space()
			if !l.value(depth+1, floats) {
				return false
			}
			l.space()
			if l.eat(']') {
				return true
			}
			if !l.eat(',') {
				return false
			}
		}
	case c == '-' || '0' <= c && c <= '9':
		s, e, ok := l.number()
		return ok && (!floats || fitsFloat(l.b[s:e]))
	case c == 't':
		return l.literal("true")
	case c == 'f':
		return l.literal("false")
	case c == 'n':
		return l.literal("null")
	}
	return false
}

// audience consumes an aud claim (not null): a string or an array of strings.
func (l *lexer) audience() bool {
	if l.peek() == '"' {
		_, _, ok := l.str()
		return ok
	}
	if !l.eat('[') {
		return false
	}
	l.space()
	if l.eat(']') {
		return true
	}
	for {
		l.space()
		if _, _, ok := l.str(); !ok {
			return false
		}
		l.space()
		if l.eat(']') {
			return true
		}
		if !l.eat(',') {
			return false
		}
	}
}

// numericDate consumes a date claim (not null) as golang-jwt reads one: a
// number, or a string holding a JSON number, in seconds, truncated to the
// second.
func (l *lexer) numericDate() (time.Time, bool) {
	var lit []byte
	var buf [64]byte
	switch c := l.peek(); {
	case c == '"':
		s, e, ok := l.str()
		if !ok {
			return time.Time{}, false
		}
		var fits bool
		lit, fits = unquote(buf[:0], l.b[s:e], -1)
		if !fits || !isValidNumber(lit) {
			return time.Time{}, false
		}
	case c == '-' || '0' <= c && c <= '9':
		s, e, ok := l.number()
		if !ok {
			return time.Time{}, false
		}
		lit = l.b[s:e]
	default:
		return time.Time{}, false
	}
	f, ok := parseSeconds(lit)
	if !ok {
		return time.Time{}, false
	}
	round, frac := math.Modf(f)
	if frac == 0 {
		return time.Unix(int64(round), 0), true // whole seconds already
	}
	return time.Unix(int64(round), int64(frac*1e9)).Truncate(time.Second), true
}

// parseSeconds is strconv.ParseFloat of a JSON number, without its cost
// for the usual whole number of at most 15 digits (exact in a float64).
func parseSeconds(lit []byte) (float64, bool) {
	digits := lit
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 15 {
		return parseFloat(lit)
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return parseFloat(lit)
		}
		n = n*10 + int64(c-'0')
	}
	if len(digits) < len(lit) {
		return -float64(n), true
	}
	return float64(n), true
}

func parseFloat(lit []byte) (float64, bool) {
	f, err := strconv.ParseFloat(string(lit), 64)
	return f, err == nil
}

func hexVal(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// getu4 decodes \uXXXX at the start of s, or returns -1.
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		h := hexVal(c)
		if h < 0 {
			return -1
		}
		r = r*16 + h
	}
	return r
}

// unquote appends the decoded contents s of a JSON string (already
// validated by lexer.str) to dst as encoding/json decodes them (invalid
// UTF-8 and lone surrogates become U+FFFD). With max >= 0 it stops, fits
// false, once dst grows past max bytes (give dst room for max+4).
func unquote(dst, s []byte, max int) (_ []byte, fits bool) {
	// Plain ASCII up to the first escape or multi-byte rune is copied as
	// it is.
	plain := 0
	for plain < len(s) && s[plain] != '\\' && s[plain] < utf8.RuneSelf {
		plain++
	}
	if max >= 0 && len(dst)+plain > max+1 {
		plain = max + 1 - len(dst)
		if plain < 0 {
			plain = 0
		}
	}
	dst = append(dst, s[:plain]...)
	for r := plain; r < len(s); {
		if max >= 0 && len(dst) > max {
			return dst, false
		}
		c := s[r]
		switch {
		case c == '\\':
			switch s[r+1] {
			case '"', '\\', '/':
				dst = append(dst, s[r+1])
				r += 2
			case 'b':
				dst = append(dst, '\b')
				r += 2
			case 'f':
				dst = append(dst, '\f')
				r += 2
			case 'n':
				dst = append(dst, '\n')
				r += 2
			case 'r':
				dst = append(dst, '\r')
				r += 2
			case 't':
				dst = append(dst, '\t')
				r += 2
			case 'u':
				rr := getu4(s[r:])
				r += 6
				if utf16.IsSurrogate(rr) {
					if dec := utf16.DecodeRune(rr, getu4(s[r:])); dec != unicode.ReplacementChar {
						dst = utf8.AppendRune(dst, dec)
						r += 6
						break
					}
					rr = unicode.ReplacementChar
				}
				dst = utf8.AppendRune(dst, rr)
			}
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			r += size
			dst = utf8.AppendRune(dst, rr)
		}
	}
	if max >= 0 && len(dst) > max {
		return dst, false
	}
	return dst, true
}

// signHS256 mints the token Sign returns: golang-jwt's encoding of the
// registered claims sub, exp and iat (whole seconds), HS256.
func signHS256(secret []byte, sub string, now time.Time, ttl time.Duration) string {
	const header = hs256Header
	claims := []byte(`{`)
	if sub != "" {
		s, _ := json.Marshal(sub)
		claims = append(append(append(claims, `"sub":`...), s...), ',')
	}
	claims = strconv.AppendInt(append(claims, `"exp":`...), now.Add(ttl).Truncate(time.Second).Unix(), 10)
	claims = strconv.AppendInt(append(claims, `,"iat":`...), now.Truncate(time.Second).Unix(), 10)
	claims = append(claims, '}')
	enc := base64.RawURLEncoding
	tok := header + "." + enc.EncodeToString(claims)
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(tok))
	return tok + "." + enc.EncodeToString(m.Sum(nil))
}
