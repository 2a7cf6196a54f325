package httpapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/internal/sale"
)

// verifyWithJWT is the verifier flashsale used before jwt.go: golang-jwt,
// HS256 pinned, exp required, 30s leeway. The hand verifier must give the
// same verdict and subject on every token.
func verifyWithJWT(secret string, now time.Time, tok string) (string, bool) {
	if len(tok) > 4096 {
		return "", false
	}
	claims := &jwt.RegisteredClaims{}
	_, err := jwt.ParseWithClaims(tok, claims, func(*jwt.Token) (any, error) { return []byte(secret), nil },
		jwt.WithValidMethods([]string{"HS256"}),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(30*time.Second),
		jwt.WithTimeFunc(func() time.Time { return now }),
	)
	if err != nil || !sale.ValidUser(claims.Subject) {
		return "", false
	}
	return claims.Subject, true
}

const diffSecret = "k"

var diffNow = time.Unix(1_800_000_000, 0)

func diffAuth() *UserAuth {
	a := NewUserAuth(diffSecret)
	a.now = func() time.Time { return diffNow }
	return a
}

// signRaw signs header and claims as given (any bytes) with secret.
func signRaw(secret string, header, claims []byte) string {
	enc := base64.RawURLEncoding
	s := enc.EncodeToString(header) + "." + enc.EncodeToString(claims)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(s))
	return s + "." + enc.EncodeToString(m.Sum(nil))
}

// checkSame fails t if the two verifiers disagree on tok.
func checkSame(t *testing.T, a *UserAuth, tok string) {
	t.Helper()
	want, wantOK := verifyWithJWT(diffSecret, diffNow, tok)
	got, err := a.Verify(tok)
	if (err == nil) != wantOK || got != want {
		t.Fatalf("token %q: hand verifier %q %v, golang-jwt %q ok=%v", tok, got, err, want, wantOK)
	}
}

// diffCases are tokens at the edges of what golang-jwt accepts.
var diffHeaders = []string{
	`{"alg":"HS256","typ":"JWT"}`, `{"alg":"HS256"}`, `{"typ":"JWT","alg":"HS256"}`, ` {"alg" : "HS256"} `,
	`{"alg":"HS\u0032\u0035\u0036"}`, `{"al\u0067":"HS256"}`, `{"alg":"HS256","alg":"none"}`, `{"alg":"none","alg":"HS256"}`,
	`{"alg":"HS256","alg":null}`, `{"alg":"hs256"}`, `{"ALG":"HS256"}`, `{"alg":"HS256","kid":[1,{"a":1e400}]}`,
	`{"alg":"HS256","x":1e308}`, `{"alg":"HS256","x":-1e-400}`, `{"alg":"HS256"} x`, `{"alg":"HS256",}`, `null`, `[]`,
	`{"alg":"HS256","x":"\ud800"}`, "{\"alg\":\"HS256\",\"x\":\"\xff\"}", `{"alg":"HS384"}`, `{"alg":"none"}`, `{}`, ``,
	`{"alg":"HS256","x":01}`, `{"alg":"HS256","x":1.}`, `{"alg":"HS256","x":tru}`, `{"alg":"HS256"}}`,
}

var diffClaims = []string{
	`{"sub":"bob","exp":1800000060}`, `{"sub":"bob","exp":1799999980}`, `{"sub":"bob","exp":1799999960}`,
	`{"sub":"bob","exp":1799999970}`, `{"sub":"bob","exp":1799999970.5}`, `{"sub":"bob","exp":1799999969.999}`,
	`{"sub":"bob","exp":"1800000060"}`, `{"sub":"bob","exp":"18e8"}`, `{"sub":"bob","exp":"0x10"}`, `{"sub":"bob","exp":" 1"}`,
	`{"sub":"bob","exp":1e400}`, `{"sub":"bob","exp":-1e400}`, `{"sub":"bob","exp":1e300}`, `{"sub":"bob","exp":-1e300}`,
	`{"sub":"bob","exp":null}`, `{"sub":"bob","exp":1900000000,"exp":null}`, `{"sub":"bob","exp":null,"exp":1900000000}`,
	`{"sub":"bob","exp":true}`, `{"sub":"bob","exp":{}}`, `{"sub":"bob","exp":[1900000000]}`, `{"sub":"bob"}`,
	`{"sub":"bob","EXP":1900000000}`, `{"SUB":"bob","Exp":1900000000}`, `{"ſub":"bob","exp":1900000000}`, `{"\u017fub":"bob","exp":1900000000}`,
	`{"sub":"bob","exp":1900000000,"nbf":1800000020}`, `{"sub":"bob","exp":1900000000,"nbf":1800000040}`, `{"sub":"bob","exp":1900000000,"nbf":1800000030}`,
	`{"sub":"bob","exp":1900000000,"nbf":null}`, `{"sub":"bob","exp":1900000000,"nbf":"x"}`, `{"sub":"bob","exp":1900000000,"iat":"x"}`,
	`{"sub":"bob","exp":1900000000,"iat":1e999}`, `{"sub":"bob","exp":1900000000,"aud":"a"}`, `{"sub":"bob","exp":1900000000,"aud":["a","b"]}`,
	`{"sub":"bob","exp":1900000000,"aud":[]}`, `{"sub":"bob","exp":1900000000,"aud":[1]}`, `{"sub":"bob","exp":1900000000,"aud":[null]}`,
	`{"sub":"bob","exp":1900000000,"aud":null}`, `{"sub":"bob","exp":1900000000,"aud":{}}`, `{"sub":"bob","exp":1900000000,"iss":1}`,
	`{"sub":"bob","exp":1900000000,"jti":null}`, `{"sub":"bob","exp":1900000000,"x":1e999}`, `{"sub":"bob","exp":1900000000,"x":{"y":[]}}`,
	`{"sub":"bob","sub":null,"exp":1900000000}`, `{"sub":"bob","sub":"al","exp":1900000000}`, `{"sub":42,"exp":1900000000}`,
	`{"sub":"b\u006fb","exp":1900000000}`, `{"sub":"bob\u0000","exp":1900000000}`, `{"sub":"bob","exp":1900000000} x`,
	`{"sub":"bob","exp":1900000000}  `, `null`, `[]`, `"x"`, `{}`, ``, `{"sub":"bob","exp":1900000000,}`,
	"{\"sub\":\"bob\xff\",\"exp\":1900000000}", `{"sub":"` + strings.Repeat("b", 128) + `","exp":1900000000}`,
	`{"sub":"` + strings.Repeat("b", 129) + `","exp":1900000000}`, `{"sub":"bob","exp":-0}`, `{"sub":"bob","exp":"-0.5"}`,
}

// TestVerifyTokenMatchesJWT: the hand verifier and golang-jwt agree on
// tokens at the edges of the header, the claims and the encoding. The
// first header is the one verifyHS256 knows without decoding it.
func TestVerifyTokenMatchesJWT(t *testing.T) {
	if h := base64.RawURLEncoding.EncodeToString([]byte(diffHeaders[0])); h != hs256Header {
		t.Fatalf("the known header is %s, diffHeaders[0] %s", hs256Header, h)
	}
	a := diffAuth()
	for _, h := range diffHeaders {
		for _, c := range diffClaims {
			tok := signRaw(diffSecret, []byte(h), []byte(c))
			checkSame(t, a, tok)
			checkSame(t, a, signRaw("other", []byte(h), []byte(c)))
			p := strings.Split(tok, ".")
			checkSame(t, a, p[0]+"."+p[1]+"."+p[2]+"=")
			checkSame(t, a, p[0]+"\n."+p[1]+"."+p[2])
			checkSame(t, a, p[0]+"."+p[1]+".\r\n"+p[2])
			checkSame(t, a, p[0]+"."+p[1]+"."+p[2][:len(p[2])-1])
			checkSame(t, a, p[0]+"."+p[1]+"."+p[2]+"A")
		}
	}
	good, _ := Sign(diffSecret, "alice", time.Hour)
	p := strings.Split(good, ".")
	for _, tok := range []string{"", ".", "..", "...", "a.b.c", good + ".", "." + good, p[0] + "." + p[1],
		p[0] + "==." + p[1] + "." + p[2], strings.ToUpper(good), strings.Repeat("a", 4097)} {
		checkSame(t, a, tok)
	}
}

// TestSignMatchesJWT: Sign mints the token golang-jwt did.
func TestSignMatchesJWT(t *testing.T) {
	now := time.Unix(1_800_000_000, 123_000_000)
	for _, sub := range []string{"alice", "", "a<b>&\"c\u2028", "ü"} {
		want, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
			Subject: sub, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(90 * time.Minute)),
		}).SignedString([]byte("s"))
		if err != nil {
			t.Fatal(err)
		}
		if got := signHS256([]byte("s"), sub, now, 90*time.Minute); got != want {
			t.Errorf("sub %q: %s, golang-jwt %s", sub, got, want)
		}
	}
}

// FuzzVerifyTokenDifferential: whatever the header and claims (signed with
// the secret, or not, with line breaks in the segments or not), and
// whatever raw token, the hand verifier's verdict and subject are
// golang-jwt's.
func FuzzVerifyTokenDifferential(f *testing.F) {
	for i, h := range diffHeaders {
		for j, c := range diffClaims {
			if (i+j)%5 == 0 {
				f.Add([]byte(h), []byte(c), byte(i+j), "")
			}
		}
	}
	good, _ := Sign(diffSecret, "alice", time.Hour)
	f.Add([]byte(nil), []byte(nil), byte(0), good)
	f.Add([]byte(nil), []byte(nil), byte(0), "a.b.c")
	a := diffAuth()
	f.Fuzz(func(t *testing.T, header, claims []byte, mode byte, raw string) {
		checkSame(t, a, raw)
		secret := diffSecret
		if mode&1 != 0 {
			secret = "other"
		}
		tok := signRaw(secret, header, claims)
		if mode&2 != 0 {
			// A line break inside a segment, covered by the signature.
			p := strings.SplitN(tok, ".", 3)
			i := int(mode>>2) % (len(p[1]) + 1)
			s := p[0] + "." + p[1][:i] + "\n" + p[1][i:]
			m := hmac.New(sha256.New, []byte(secret))
			m.Write([]byte(s))
			tok = s + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
		}
		checkSame(t, a, tok)
	})
}
