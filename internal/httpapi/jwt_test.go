package httpapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/internal/sale"
)

// verifyWithJWT is the reference: golang-jwt, HS256 pinned, exp required,
// 30s leeway, then a valid user id. The verifier must give the same verdict
// and subject on every token.
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
		t.Fatalf("token %q: verifier %q %v, golang-jwt %q ok=%v", tok, got, err, want, wantOK)
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

// compactCases are claims at the edges of the fast path's shape: each is
// read by readCompact or left to golang-jwt, and either way the verdict is
// golang-jwt's.
var compactCases = []string{
	`{"sub":"bob","exp":1800000060,"iat":1799999000}`, `{"iat":1799999000,"exp":1800000060,"sub":"bob"}`,
	`{"iss":"https://login.example.com/","sub":"bob","aud":"flashsale","exp":1800000060,"nbf":1799999000,"iat":1799999000,"jti":"a-1"}`,
	`{"sub":"bob","exp":1800000060,"name":"Zoë","email_verified":true,"admin":false,"x":null,"n":0,"":""}`,
	`{"sub":"bob","exp":1800000060,"https://example.com/roles":"buyer"}`, `{"sub":"bob","exp":1800000060,"roles":["a"]}`,
	`{"sub":"bob","exp":1800000060,"o":{}}`, `{"sub":"bob","exp":1800000060,"uid":7,"azp":"x"}`,
	`{"Sub":"bob","exp":1800000060}`, `{"sub":"bob","EXP":1800000060}`, `{"sub":"bob","exp":1800000060,"Nbf":1900000000}`,
	`{"sub":"bob","exp":1800000060,"iAt":"x"}`, `{"sub":"bob","sub":"al","exp":1800000060}`, `{"sub":"bob","exp":1800000060,"exp":1}`,
	`{"sub":"bob","exp":1800000060,"x":1,"x":2}`, `{"sub":"bob","exp":180000006000000}`, `{"sub":"bob","exp":1800000060000000}`,
	`{"sub":"bob","exp":0}`, `{"sub":"bob","exp":01800000060}`, `{"sub":"bob","exp":1800000060.0}`, `{"sub":"bob","exp":18000000e2}`,
	`{"sub":"bob","exp":-1}`, `{"sub":"bob","exp":"1800000060"}`, `{"sub":"bob","exp":1800000060,"nbf":null}`, `{"sub":null,"exp":1800000060}`,
	`{"sub":"b\u006fb","exp":1800000060}`, `{"sub":"bøb","exp":1800000060}`, "{\"sub\":\"bob\x7f\",\"exp\":1800000060}",
	"{\"sub\":\"bob\",\"exp\":1800000060,\"x\":\"\xff\"}", "{\"sub\":\"bob\",\"exp\":1800000060,\"x\":\"\x01\"}",
	`{"sub":"bob","exp":1800000060,"iss":1}`, `{"sub":"bob","exp":1800000060,"aud":["a","b"]}`, `{"sub":"bob","exp":1800000060,"aud":null}`,
	`{"sub":"bob","exp":1800000060,"jti":true}`, `{"sub":"bob","exp":1800000060,"x":tru}`, `{"sub":"bob","exp":1800000060,"x":nul}`,
	`{"sub":"bob","exp":1800000060,"x":1x}`, `{"sub":"bob","exp":1800000060,}`, `{,"sub":"bob","exp":1800000060}`, `{"sub":"bob""exp":1800000060}`,
	`{"sub":"bob","exp":1800000060}}`, `{{"sub":"bob","exp":1800000060}`, `{"sub":"bob","exp":1800000060 }`, `{"sub":"bob","exp" :1800000060}`,
	`{"sub":"bob","exp":1800000060,"x":"}`, `{"sub":"bob","exp":1800000060,"x`, `{"sub":"bob","exp":1800000060,"x":}`, `{"sub":"bob","exp":}`,
	`{"sub":"","exp":1800000060}`, `{"exp":1800000060}`, `{"sub":"bob","nbf":1}`, `{}`, `{"sub":"bob","exp":1800000060,"nbf":1800000031}`,
	`{"sub":"bob","exp":1799999970}`, `{"sub":"bob","exp":1799999971}`, `{"sub":"bob","exp":1800000060,"nbf":1800000030}`,
	`{"sub":"` + strings.Repeat("b", 128) + `","exp":1800000060}`, `{"sub":"` + strings.Repeat("b", 129) + `","exp":1800000060}`,
}

// TestVerifyTokenMatchesJWT: the verifier and golang-jwt agree on tokens at
// the edges of the header, the claims and the encoding, each header with
// each set of claims (the fast path's headers with every claims case).
func TestVerifyTokenMatchesJWT(t *testing.T) {
	a := diffAuth()
	var headers []string
	for _, h := range compactHeaders {
		b, err := base64.RawURLEncoding.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		headers = append(headers, string(b))
	}
	headers = append(headers, diffHeaders...)
	for _, h := range headers {
		for _, c := range append(diffClaims, compactCases...) {
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

// TestFastPath: the tokens Sign and the usual login services mint take the
// fast path (so BenchmarkVerifyToken measures it); the others are read by
// golang-jwt.
func TestFastPath(t *testing.T) {
	fast := func(tok string) bool {
		p := strings.Split(tok, ".")
		c, err := base64.RawURLEncoding.DecodeString(p[1])
		if err != nil {
			t.Fatal(err)
		}
		_, ok := readCompact(c)
		return compactHeader(p[0]) && ok
	}
	for _, sub := range []string{"alice", "user-12345", "a@b.c", ""} {
		tok, err := Sign(diffSecret, sub, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if !fast(tok) {
			t.Errorf("Sign's token for %q is not on the fast path: %s", sub, tok)
		}
	}
	for i, c := range compactCases[:4] {
		if tok := signRaw(diffSecret, []byte(`{"alg":"HS256","typ":"JWT"}`), []byte(c)); !fast(tok) {
			t.Errorf("compactCases[%d] %s is not on the fast path", i, c)
		}
	}
	for _, c := range []string{`{"Sub":"bob","exp":1800000060}`, `{"sub":"bob","exp":1800000060,"roles":["a"]}`, `{"sub":"bob","exp":1.5}`,
		`{"sub":"bob","sub":"al","exp":1800000060}`, `{"sub":"b\u006fb","exp":1800000060}`, `{ "sub":"bob","exp":1800000060}`} {
		if tok := signRaw(diffSecret, []byte(`{"alg":"HS256","typ":"JWT"}`), []byte(c)); fast(tok) {
			t.Errorf("%s is on the fast path", c)
		}
	}
}

// checkCompact fails t if readCompact reads claims other than encoding/json
// does into RegisteredClaims (golang-jwt's reading).
func checkCompact(t *testing.T, claims []byte) {
	t.Helper()
	c, ok := readCompact(claims)
	if !ok {
		return
	}
	var want jwt.RegisteredClaims
	if err := json.Unmarshal(claims, &want); err != nil {
		t.Fatalf("readCompact took %q, encoding/json refuses it: %v", claims, err)
	}
	unix := func(d *jwt.NumericDate) (int64, bool) {
		if d == nil {
			return 0, false
		}
		return d.Unix(), true
	}
	wantExp, wantHasExp := unix(want.ExpiresAt)
	wantNbf, wantHasNbf := unix(want.NotBefore)
	if string(c.sub) != want.Subject || c.hasExp != wantHasExp || c.exp != wantExp || c.hasNbf != wantHasNbf || c.nbf != wantNbf {
		t.Fatalf("readCompact read %q as %+v, encoding/json as %+v", claims, c, want)
	}
}

// FuzzVerifyTokenDifferential: whatever the header (any, or one of the fast
// path's) and claims (signed with the secret, or not, with line breaks in
// the segments or not), and whatever raw token, the verifier's verdict and
// subject are golang-jwt's; and whatever claims the fast path reads, it
// reads as encoding/json does.
func FuzzVerifyTokenDifferential(f *testing.F) {
	for i, h := range diffHeaders {
		for j, c := range diffClaims {
			if (i+j)%10 == 0 { // a sample: TestVerifyTokenMatchesJWT runs them all
				f.Add([]byte(h), []byte(c), byte(i+j), "")
			}
		}
	}
	good, _ := Sign(diffSecret, "alice", time.Hour)
	f.Add([]byte(nil), []byte(nil), byte(0), good)
	f.Add([]byte(nil), []byte(nil), byte(0), "a.b.c")
	a := diffAuth()
	for i, c := range compactCases {
		f.Add([]byte(nil), []byte(c), byte(i%3+1)<<2, "")
	}
	f.Fuzz(func(t *testing.T, header, claims []byte, mode byte, raw string) {
		checkSame(t, a, raw)
		checkCompact(t, claims)
		secret := diffSecret
		if mode&1 != 0 {
			secret = "other"
		}
		if k := int(mode>>2) & 3; k > 0 {
			// One of the fast path's headers, so the fuzzer works on its claims.
			header, _ = base64.RawURLEncoding.DecodeString(compactHeaders[k-1])
		}
		tok := signRaw(secret, header, claims)
		if mode&2 != 0 {
			// A line break inside a segment, covered by the signature.
			p := strings.SplitN(tok, ".", 3)
			i := int(mode>>4) % (len(p[1]) + 1)
			s := p[0] + "." + p[1][:i] + "\n" + p[1][i:]
			m := hmac.New(sha256.New, []byte(secret))
			m.Write([]byte(s))
			tok = s + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
		}
		checkSame(t, a, tok)
	})
}
