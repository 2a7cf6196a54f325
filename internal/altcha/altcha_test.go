package altcha

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/go-challenges.json (then run testdata/gen.mjs)")

const testKey = "flashsale-altcha-test-key-0123456789" // testdata/gen.mjs: HMAC_KEY

var (
	far   = time.Unix(4102444800, 0) // the vectors' expiry: 2100-01-01
	now   = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	later = far.Add(time.Second)
)

// vectors is testdata/vectors.json, written by testdata/gen.mjs.
type vectors struct {
	AltchaLib string `json:"altchaLib"`
	Altcha    string `json:"altcha"`
	HMACKey   string `json:"hmacKey"`
	V1        []struct {
		Name       string            `json:"name"`
		SaltPrefix string            `json:"saltPrefix"`
		Params     map[string]string `json:"params"`
		Expires    int64             `json:"expires"`
		Number     uint64            `json:"number"`
		MaxNumber  uint64            `json:"maxnumber"`
		Want       string            `json:"want"`
		Challenge  challengeV1       `json:"challenge"`
		payloads
	} `json:"v1"`
	V2 []struct {
		Name      string            `json:"name"`
		Algorithm string            `json:"algorithm"`
		Cost      int64             `json:"cost"`
		Counter   *uint32           `json:"counter"`
		Data      map[string]string `json:"data"`
		ExpiresAt int64             `json:"expiresAt"`
		Want      string            `json:"want"`
		Challenge challengeV2       `json:"challenge"`
		Signed    string            `json:"signed"`
		payloads
	} `json:"v2"`
	Go []struct {
		Name                     string          `json:"name"`
		Challenge                json.RawMessage `json:"challenge"`
		GoPayloadLibVerified     bool            `json:"goPayloadLibVerified"`
		WidgetPayload            string          `json:"widgetPayload"`
		WidgetPayloadLibVerified bool            `json:"widgetPayloadLibVerified"`
	} `json:"go"`
}

type payloads struct {
	LibPayload               string `json:"libPayload"`
	LibPayloadLibVerified    bool   `json:"libPayloadLibVerified"`
	WidgetPayload            string `json:"widgetPayload"`
	WidgetPayloadLibVerified bool   `json:"widgetPayloadLibVerified"`
}

func loadVectors(t testing.TB) vectors {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if v.AltchaLib != "2.8.0" || v.Altcha != "3.2.2" || v.HMACKey != testKey || len(v.V1) == 0 || len(v.V2) == 0 || len(v.Go) == 0 {
		t.Fatalf("vectors.json: altcha-lib %s, altcha %s, key %q, %d/%d/%d vectors", v.AltchaLib, v.Altcha, v.HMACKey, len(v.V1), len(v.V2), len(v.Go))
	}
	return v
}

func newIssuer(t testing.TB) *Issuer {
	t.Helper()
	s, err := New([]byte(testKey))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkVerify verifies payload at now and checks the outcome: want "ok" (with
// these params) or "expired"; the vectors' expired challenges must verify
// until they expire.
func checkVerify(t *testing.T, s *Issuer, payload, want string, params map[string]string, expires int64) {
	t.Helper()
	at := now
	if want == "expired" {
		at = time.Unix(expires, 0).Add(-time.Second)
	}
	r, err := s.Verify(payload, at)
	if err != nil {
		t.Fatalf("Verify at %s: %v", at, err)
	}
	if params == nil {
		params = map[string]string{}
	}
	if !maps.Equal(r.Params, params) || r.Expires.Unix() != expires || r.ID == "" {
		t.Fatalf("Verify = %+v, want params %v expiring at %d", r, params, expires)
	}
	if _, err := s.Verify(payload, time.Unix(expires, 0).Add(time.Second)); !errors.Is(err, ErrExpired) {
		t.Fatalf("Verify a second past expiry: %v, want ErrExpired", err)
	}
	if want == "expired" {
		if _, err := s.Verify(payload, now); !errors.Is(err, ErrExpired) {
			t.Fatalf("Verify now: %v, want ErrExpired", err)
		}
	}
}

// TestReferenceV1 verifies altcha-lib/v1's challenges as solved by altcha-lib
// and by the widget, and makes the same challenges from the same inputs.
func TestReferenceV1(t *testing.T) {
	v, s := loadVectors(t), newIssuer(t)
	for _, c := range v.V1 {
		t.Run(c.Name, func(t *testing.T) {
			if got := s.createV1(c.SaltPrefix, c.Params, c.Expires, c.Number, c.MaxNumber); got != c.Challenge {
				t.Errorf("createV1 =\n%+v, altcha-lib made\n%+v", got, c.Challenge)
			}
			if c.LibPayloadLibVerified != (c.Want == "ok") || c.WidgetPayloadLibVerified != (c.Want == "ok") {
				t.Errorf("altcha-lib verified %v (its solution) and %v (the widget's), want %s", c.LibPayloadLibVerified, c.WidgetPayloadLibVerified, c.Want)
			}
			t.Run("lib", func(t *testing.T) { checkVerify(t, s, c.LibPayload, c.Want, c.Params, c.Expires) })
			t.Run("widget", func(t *testing.T) { checkVerify(t, s, c.WidgetPayload, c.Want, c.Params, c.Expires) })
		})
	}
}

// TestReferenceV2 verifies altcha-lib's challenges as solved by altcha-lib
// and by the widget, signs the same string, and makes the deterministic ones
// from the same inputs.
func TestReferenceV2(t *testing.T) {
	v, s := loadVectors(t), newIssuer(t)
	for _, c := range v.V2 {
		t.Run(c.Name, func(t *testing.T) {
			p := c.Challenge.Parameters
			if got := string(p.canonical()); got != c.Signed {
				t.Errorf("canonical =\n%s, altcha-lib signs\n%s", got, c.Signed)
			}
			if c.Counter != nil {
				in := parameters{Algorithm: c.Algorithm, Cost: c.Cost, Data: c.Data, ExpiresAt: c.ExpiresAt, KeyLength: 32, Nonce: p.Nonce, Salt: p.Salt}
				got, err := s.createV2(in, *c.Counter)
				if err != nil || !equalV2(got, c.Challenge) {
					t.Errorf("createV2 = %+v, %v; altcha-lib made\n%+v", got, err, c.Challenge)
				}
			}
			if c.LibPayloadLibVerified != (c.Want == "ok") || c.WidgetPayloadLibVerified != (c.Want == "ok") {
				t.Errorf("altcha-lib verified %v (its solution) and %v (the widget's), want %s", c.LibPayloadLibVerified, c.WidgetPayloadLibVerified, c.Want)
			}
			t.Run("lib", func(t *testing.T) { checkVerify(t, s, c.LibPayload, c.Want, c.Data, c.ExpiresAt) })
			t.Run("widget", func(t *testing.T) { checkVerify(t, s, c.WidgetPayload, c.Want, c.Data, c.ExpiresAt) })
		})
	}
}

func equalV2(a, b challengeV2) bool {
	pa, pb := a.Parameters, b.Parameters
	return string(pa.canonical()) == string(pb.canonical()) && a.Signature == b.Signature
}

// goChallenge is an entry of testdata/go-challenges.json: a challenge made
// here from fixed inputs, and the payload of solving it here. gen.mjs has
// altcha-lib verify the payload and the widget solve the challenge.
type goChallenge struct {
	Name      string          `json:"name"`
	Challenge json.RawMessage `json:"challenge"`
	Payload   string          `json:"payload"`
	params    map[string]string
	expires   int64
}

func goChallenges(t *testing.T, s *Issuer) []goChallenge {
	bound := map[string]string{"buyer": "buyer-42", "sku": "SKU-1001"}
	awkward := map[string]string{"note": `q"uo\te <b>&amp; ~*+%;?=`, "sku": "X"}
	v1 := s.createV1("5f1a9e0c7b3d2a6f4e8c1d0b", awkward, far.Unix(), 54321, 100000)
	var out []goChallenge
	out = append(out, goChallenge{Name: "v1", Challenge: mustJSON(t, v1), Payload: solveV1(t, v1), params: awkward})
	for _, in := range []struct {
		name    string
		p       parameters
		counter uint32
	}{
		{"v2 pbkdf2", parameters{Algorithm: AlgorithmPBKDF2SHA256, Cost: 1000, Data: bound, Nonce: "00112233445566778899aabbccddeeff", Salt: "ffeeddccbbaa99887766554433221100"}, 77},
		{"v2 sha-256", parameters{Algorithm: AlgorithmSHA256, Cost: 50, Data: awkward, Nonce: "0f0e0d0c0b0a09080706050403020100", Salt: "000102030405060708090a0b0c0d0e0f"}, 300},
	} {
		in.p.ExpiresAt, in.p.KeyLength = far.Unix(), keyLength
		c, err := s.createV2(in.p, in.counter)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, goChallenge{Name: in.name, Challenge: mustJSON(t, c), Payload: solveV2(t, c), params: in.p.Data})
	}
	for i := range out {
		out[i].expires = far.Unix()
	}
	return out
}

// TestGoChallenges checks that this package's challenges, made from fixed
// inputs, are those of go-challenges.json, that altcha-lib verified the
// payloads solved here, and that the widget's solutions verify here.
func TestGoChallenges(t *testing.T) {
	s := newIssuer(t)
	made := goChallenges(t, s)
	golden := filepath.Join("testdata", "go-challenges.json")
	b, err := json.MarshalIndent(made, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	if *update {
		if err := os.WriteFile(golden, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if want, err := os.ReadFile(golden); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("%s differs from what this package makes (%v): run go test -run TestGoChallenges -update, then testdata/gen.mjs", golden, err)
	}
	v := loadVectors(t)
	if len(v.Go) != len(made) {
		t.Fatalf("vectors.json has %d Go-made challenges, want %d: run testdata/gen.mjs", len(v.Go), len(made))
	}
	for i, g := range made {
		t.Run(g.Name, func(t *testing.T) {
			r := v.Go[i]
			if !jsonEqual(t, r.Challenge, g.Challenge) {
				t.Fatalf("vectors.json holds another challenge than go-challenges.json: run testdata/gen.mjs")
			}
			if !r.GoPayloadLibVerified || !r.WidgetPayloadLibVerified {
				t.Errorf("altcha-lib verified %v (Go's solution) and %v (the widget's), want both", r.GoPayloadLibVerified, r.WidgetPayloadLibVerified)
			}
			checkVerify(t, s, g.Payload, "ok", g.params, g.expires)
			checkVerify(t, s, r.WidgetPayload, "ok", g.params, g.expires)
		})
	}
}

// TestCreate solves what Create makes, in both formats, and verifies it.
func TestCreate(t *testing.T) {
	s := newIssuer(t)
	bound := map[string]string{"buyer": "u-1", "sku": "SKU-9"}
	for _, c := range []struct {
		o                 Options
		wantCost, wantMax int64 // with the defaults filled in
	}{
		{Options{V1: true, MaxNumber: 2000, Params: bound}, 1, 2000},
		{Options{MinNumber: 3, MaxNumber: 20, Cost: 100, Params: bound}, 100, 20},
		{Options{Algorithm: AlgorithmSHA256, MaxNumber: 50, Cost: 10}, 10, 50},
		{Options{MaxNumber: 5, Cost: 1}, 1, 5},
		{Options{V1: true}, 1, 100_000},
		{Options{Algorithm: AlgorithmSHA256}, 1, 100_000},
		{Options{Params: bound}, 5000, 500},
	} {
		o := c.o
		o.Expires = now.Add(time.Minute)
		raw, err := s.Create(o)
		if err != nil {
			t.Fatal(err)
		}
		var payload string
		if o.V1 {
			var ch challengeV1
			mustUnmarshal(t, raw, &ch)
			if int64(ch.MaxNumber) != c.wantMax || (o.Params != nil && !strings.Contains(ch.Salt, "?buyer=u-1&sku=SKU-9&expires=")) {
				t.Errorf("v1 challenge %s", raw)
			}
			payload = solveV1(t, ch)
		} else {
			var ch challengeV2
			mustUnmarshal(t, raw, &ch)
			wantAlg := AlgorithmPBKDF2SHA256
			if o.Algorithm != "" {
				wantAlg = o.Algorithm
			}
			if ch.Parameters.Algorithm != wantAlg || ch.Parameters.Cost != c.wantCost || len(ch.Parameters.KeyPrefix) != 32 {
				t.Errorf("v2 challenge %s", raw)
			}
			payload = solveV2(t, ch)
			var sol struct {
				Solution struct{ Counter uint32 } `json:"solution"`
			}
			mustUnmarshal(t, decode(t, payload), &sol)
			if n := int64(sol.Solution.Counter); n < int64(o.MinNumber) || n > c.wantMax {
				t.Errorf("counter %d outside [%d, %d]", n, o.MinNumber, c.wantMax)
			}
		}
		want := o.Params
		if want == nil {
			want = map[string]string{}
		}
		r, err := s.Verify(payload, now)
		if err != nil || !maps.Equal(r.Params, want) || !r.Expires.Equal(o.Expires.Truncate(time.Second)) {
			t.Errorf("Verify(%+v) = %+v, %v", o, r, err)
		}
	}
}

func TestCreateRejects(t *testing.T) {
	if _, err := New([]byte("short")); err == nil {
		t.Error("New accepted a 5-byte key")
	}
	s := newIssuer(t)
	exp := now.Add(time.Minute)
	for name, o := range map[string]Options{
		"no expiry":       {},
		"reserved param":  {Expires: exp, Params: map[string]string{"expires": "1"}},
		"digit key":       {Expires: exp, Params: map[string]string{"1": "x"}},
		"non-ASCII value": {Expires: exp, Params: map[string]string{"buyer": "Jürgen"}},
		"control char":    {Expires: exp, Params: map[string]string{"buyer": "a\nb"}},
		"min above max":   {Expires: exp, MinNumber: 10, MaxNumber: 5},
		"algorithm":       {Expires: exp, Algorithm: "SHA-512"},
		"cost":            {Expires: exp, Cost: maxCost + 1},
	} {
		if c, err := s.Create(o); err == nil {
			t.Errorf("%s: Create made %s", name, c)
		}
	}
}

// TestVerifyErrors tampers with valid payloads of both formats.
func TestVerifyErrors(t *testing.T) {
	s := newIssuer(t)
	other, _ := New([]byte("another-key-of-sufficient-length"))
	params := map[string]string{"buyer": "buyer-42", "sku": "SKU-1001"}
	v1 := s.createV1("a1b2c3d4e5f60718293a4b5c", params, far.Unix(), 4242, 100000)
	v2, err := s.createV2(parameters{Algorithm: AlgorithmPBKDF2SHA256, Cost: 100, Data: params, ExpiresAt: far.Unix(), KeyLength: keyLength, Nonce: "00112233445566778899aabbccddeeff", Salt: "ffeeddccbbaa99887766554433221100"}, 42)
	if err != nil {
		t.Fatal(err)
	}
	// edit decodes a payload to a generic JSON object, changes it, encodes it.
	edit := func(payload string, f func(m map[string]any)) string {
		var m map[string]any
		mustUnmarshal(t, decode(t, payload), &m)
		f(m)
		return base64.StdEncoding.EncodeToString(mustJSON(t, m))
	}
	p1, p2 := solveV1(t, v1), solveV2(t, v2)
	params2 := func(m map[string]any) map[string]any {
		return m["challenge"].(map[string]any)["parameters"].(map[string]any)
	}
	solution := func(m map[string]any) map[string]any { return m["solution"].(map[string]any) }
	for _, c := range []struct {
		name    string
		s       *Issuer
		payload string
		at      time.Time
		want    error
	}{
		{"v1 ok", s, p1, now, nil},
		{"v2 ok", s, p2, now, nil},
		{"v1 at expiry", s, p1, far, nil},
		{"v1 expired", s, p1, later, ErrExpired},
		{"v2 expired", s, p2, later, ErrExpired},
		{"v1 other key", other, p1, now, ErrBadSignature},
		{"v2 other key", other, p2, now, ErrBadSignature},
		{"v1 signature", s, edit(p1, func(m map[string]any) { m["signature"] = flipHex(m["signature"].(string)) }), now, ErrBadSignature},
		{"v2 signature", s, edit(p2, func(m map[string]any) {
			c := m["challenge"].(map[string]any)
			c["signature"] = flipHex(c["signature"].(string))
		}), now, ErrBadSignature},
		{"v1 challenge", s, edit(p1, func(m map[string]any) { m["challenge"] = flipHex(m["challenge"].(string)) }), now, ErrBadSignature},
		{"v1 sku in salt", s, edit(p1, func(m map[string]any) {
			m["salt"] = strings.Replace(m["salt"].(string), "sku=SKU-1001", "sku=SKU-1002", 1)
		}), now, ErrWrongSolution},
		{"v1 later expiry in salt", s, edit(p1, func(m map[string]any) {
			m["salt"] = strings.Replace(m["salt"].(string), "expires=4102444800", "expires=4102444899", 1)
		}), now, ErrWrongSolution},
		{"v2 sku in data", s, edit(p2, func(m map[string]any) { params2(m)["data"].(map[string]any)["sku"] = "SKU-1002" }), now, ErrBadSignature},
		{"v2 added data", s, edit(p2, func(m map[string]any) { params2(m)["data"].(map[string]any)["role"] = "admin" }), now, ErrBadSignature},
		{"v2 later expiry", s, edit(p2, func(m map[string]any) { params2(m)["expiresAt"] = far.Unix() + 99 }), now, ErrBadSignature},
		{"v2 lower cost", s, edit(p2, func(m map[string]any) { params2(m)["cost"] = 1 }), now, ErrBadSignature},
		{"v2 shorter prefix", s, edit(p2, func(m map[string]any) { params2(m)["keyPrefix"] = "00" }), now, ErrBadSignature},
		{"v1 number", s, edit(p1, func(m map[string]any) { m["number"] = 4243 }), now, ErrWrongSolution},
		{"v2 counter", s, edit(p2, func(m map[string]any) { solution(m)["counter"] = 43 }), now, ErrWrongSolution},
		{"v2 derived key", s, edit(p2, func(m map[string]any) {
			solution(m)["derivedKey"] = flipHex(solution(m)["derivedKey"].(string))
		}), now, ErrWrongSolution},
		{"v2 derived key upper case", s, edit(p2, func(m map[string]any) {
			solution(m)["derivedKey"] = strings.ToUpper(solution(m)["derivedKey"].(string))
		}), now, ErrWrongSolution},
		{"v2 counter 0 with its key", s, edit(p2, func(m map[string]any) {
			key, _ := v2.Parameters.deriveKey(0)
			solution(m)["counter"], solution(m)["derivedKey"] = 0, hex.EncodeToString(key)
		}), now, ErrWrongSolution},
		// V2 checks the expiry before deriving a key: an expired challenge
		// costs no derivation, whatever its solution.
		{"v2 expired and wrong", s, edit(p2, func(m map[string]any) { solution(m)["counter"] = 43 }), later, ErrExpired},
		{"empty", s, "", now, ErrMalformed},
		{"not base64", s, "%%%not-base64%%%", now, ErrMalformed},
		{"base64 of garbage", s, base64.StdEncoding.EncodeToString([]byte("garbage{")), now, ErrMalformed},
		{"JSON array", s, base64.StdEncoding.EncodeToString([]byte(`[1,2]`)), now, ErrMalformed},
		{"no challenge", s, base64.StdEncoding.EncodeToString([]byte(`{"solution":{}}`)), now, ErrMalformed},
		{"challenge a number", s, base64.StdEncoding.EncodeToString([]byte(`{"challenge":5}`)), now, ErrMalformed},
		{"too long", s, strings.Repeat("A", maxPayload+4), now, ErrMalformed},
		{"v1 SHA-1", s, edit(p1, func(m map[string]any) { m["algorithm"] = "SHA-1" }), now, ErrMalformed},
		{"v1 negative number", s, edit(p1, func(m map[string]any) { m["number"] = -1 }), now, ErrMalformed},
		{"v1 fractional number", s, edit(p1, func(m map[string]any) { m["number"] = 4242.5 }), now, ErrMalformed},
		{"v1 number a string", s, edit(p1, func(m map[string]any) { m["number"] = "4242" }), now, ErrMalformed},
		{"v2 no solution", s, edit(p2, func(m map[string]any) { delete(m, "solution") }), now, ErrMalformed},
		{"v2 no parameters", s, edit(p2, func(m map[string]any) { delete(m["challenge"].(map[string]any), "parameters") }), now, ErrMalformed},
		{"v2 counter a string", s, edit(p2, func(m map[string]any) { solution(m)["counter"] = "42" }), now, ErrMalformed},
		{"v2 counter above uint32", s, edit(p2, func(m map[string]any) { solution(m)["counter"] = 1 << 32 }), now, ErrMalformed},
		{"v2 algorithm", s, edit(p2, func(m map[string]any) { params2(m)["algorithm"] = "ARGON2ID" }), now, ErrMalformed},
		{"v2 huge cost", s, edit(p2, func(m map[string]any) { params2(m)["cost"] = 1 << 40 }), now, ErrMalformed},
		{"v2 nonce not hex", s, edit(p2, func(m map[string]any) { params2(m)["nonce"] = "xyz" }), now, ErrMalformed},
		{"v2 non-ASCII data", s, edit(p2, func(m map[string]any) { params2(m)["data"].(map[string]any)["sku"] = "SKU-é" }), now, ErrMalformed},
		{"v2 data not strings", s, edit(p2, func(m map[string]any) { params2(m)["data"].(map[string]any)["sku"] = 5 }), now, ErrMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := c.s.Verify(c.payload, c.at)
			if !errors.Is(err, c.want) {
				t.Fatalf("Verify = %+v, %v; want %v", r, err, c.want)
			}
			for _, e := range []error{ErrMalformed, ErrBadSignature, ErrWrongSolution, ErrExpired} {
				if e != c.want && errors.Is(err, e) {
					t.Fatalf("Verify = %v: also %v", err, e)
				}
			}
			if err != nil && (r.Params != nil || r.ID != "") {
				t.Fatalf("failed Verify returned %+v", r)
			}
		})
	}
}

// TestV1SaltWithoutDelimiter: as altcha-lib/v1, a salt not ending in '&' is
// hashed with one appended, so "…=1" + "23" cannot pose as "…=12" + "3".
func TestV1SaltWithoutDelimiter(t *testing.T) {
	s := newIssuer(t)
	c := s.createV1("ab", nil, far.Unix(), 123, 1000) // salt "ab?expires=4102444800&"
	spliced := challengeV1{Algorithm: c.Algorithm, Challenge: c.Challenge, Salt: strings.TrimSuffix(c.Salt, "&") + "&1", Signature: c.Signature}
	payload := payloadV1(t, spliced, 23)
	if _, err := s.Verify(payload, now); !errors.Is(err, ErrWrongSolution) {
		t.Fatalf("spliced salt: %v, want ErrWrongSolution", err)
	}
	if _, err := s.Verify(payloadV1(t, challengeV1{Algorithm: c.Algorithm, Challenge: c.Challenge, Salt: strings.TrimSuffix(c.Salt, "&"), Signature: c.Signature}, 123), now); err != nil {
		t.Fatalf("salt without its final '&': %v", err)
	}
}

func BenchmarkVerify(b *testing.B) {
	s := newIssuer(b)
	params := map[string]string{"buyer": "buyer-42", "sku": "SKU-1001"}
	v2 := func(alg string, cost int64) string {
		c, err := s.createV2(parameters{Algorithm: alg, Cost: cost, Data: params, ExpiresAt: far.Unix(), KeyLength: keyLength, Nonce: "00112233445566778899aabbccddeeff", Salt: "ffeeddccbbaa99887766554433221100"}, 3)
		if err != nil {
			b.Fatal(err)
		}
		return solveV2(b, c)
	}
	for _, c := range []struct{ name, payload string }{
		{"v1", solveV1(b, s.createV1("a1b2c3d4e5f60718293a4b5c", params, far.Unix(), 4242, 100000))},
		{"v2-pbkdf2-cost-5000", v2(AlgorithmPBKDF2SHA256, 5000)},
		{"v2-sha256-cost-1", v2(AlgorithmSHA256, 1)},
		{"v2-sha256-cost-5000", v2(AlgorithmSHA256, 5000)},
		{"bad-signature", base64.StdEncoding.EncodeToString([]byte(strings.Replace(string(decode(b, v2(AlgorithmPBKDF2SHA256, 5000))), `"sku":"SKU-1001"`, `"sku":"SKU-1002"`, 1)))},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := s.Verify(c.payload, now); err != nil && c.name != "bad-signature" {
					b.Fatal(err)
				}
			}
		})
	}
}

// solveV1 finds the number by brute force, as a client does, and returns the
// payload the widget would submit.
func solveV1(t testing.TB, c challengeV1) string {
	t.Helper()
	for n := uint64(0); n <= c.MaxNumber; n++ {
		if hexSHA256(c.Salt+strconv.FormatUint(n, 10)) == c.Challenge {
			return payloadV1(t, c, n)
		}
	}
	t.Fatalf("no number solves %+v", c)
	return ""
}

func payloadV1(t testing.TB, c challengeV1, n uint64) string {
	return base64.StdEncoding.EncodeToString(mustJSON(t, map[string]any{
		"algorithm": c.Algorithm, "challenge": c.Challenge, "number": n, "salt": c.Salt, "signature": c.Signature, "took": 0,
	}))
}

// solveV2 finds the counter by brute force, as a client does, and returns
// the payload the widget would submit.
func solveV2(t testing.TB, c challengeV2) string {
	t.Helper()
	for n := uint32(0); n < 1<<20; n++ {
		key, err := c.Parameters.deriveKey(n)
		if err != nil {
			t.Fatal(err)
		}
		if k := hex.EncodeToString(key); strings.HasPrefix(k, c.Parameters.KeyPrefix) {
			return base64.StdEncoding.EncodeToString(mustJSON(t, map[string]any{
				"challenge": c, "solution": map[string]any{"counter": n, "derivedKey": k, "time": 0},
			}))
		}
	}
	t.Fatalf("no counter solves %+v", c)
	return ""
}

func flipHex(s string) string {
	if s[0] == '0' {
		return "1" + s[1:]
	}
	return "0" + s[1:]
}

func decode(t testing.TB, payload string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustUnmarshal(t testing.TB, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func jsonEqual(t testing.TB, a, b []byte) bool {
	var x, y any
	mustUnmarshal(t, a, &x)
	mustUnmarshal(t, b, &y)
	return string(mustJSON(t, x)) == string(mustJSON(t, y))
}

// TestVerifyFuncClaims: claim runs once a V2 payload is authentic and
// unexpired, before the derivation, and its error is returned as is; a
// forged or expired payload never reaches it.
func TestVerifyFuncClaims(t *testing.T) {
	s := newIssuer(t)
	v2, err := s.createV2(parameters{Algorithm: AlgorithmPBKDF2SHA256, Cost: 100, Data: map[string]string{"sku": "A"}, ExpiresAt: far.Unix(), KeyLength: keyLength, Nonce: "00112233445566778899aabbccddeeff", Salt: "ffeeddccbbaa99887766554433221100"}, 7)
	if err != nil {
		t.Fatal(err)
	}
	good := solveV2(t, v2)
	edit := func(f func(m map[string]any)) string {
		var m map[string]any
		mustUnmarshal(t, decode(t, good), &m)
		f(m)
		return base64.StdEncoding.EncodeToString(mustJSON(t, m))
	}
	claimed := 0
	claim := func(r Result) error {
		claimed++
		if r.Params["sku"] != "A" || r.ID == "" {
			t.Errorf("claim got %+v", r)
		}
		return nil
	}
	if _, err := s.VerifyFunc(good, now, claim); err != nil || claimed != 1 {
		t.Fatalf("good payload: %v, claimed %d", err, claimed)
	}
	errTaken := errors.New("taken")
	if _, err := s.VerifyFunc(good, now, func(Result) error { return errTaken }); err != errTaken {
		t.Fatalf("claim's error: got %v", err)
	}
	wrong := edit(func(m map[string]any) { m["solution"].(map[string]any)["derivedKey"] = strings.Repeat("0", 64) })
	claimed = 0
	if _, err := s.VerifyFunc(wrong, now, claim); !errors.Is(err, ErrWrongSolution) || claimed != 1 {
		t.Fatalf("wrong solution: %v, claimed %d (the claim comes before the derivation)", err, claimed)
	}
	claimed = 0
	forged := edit(func(m map[string]any) {
		m["challenge"].(map[string]any)["parameters"].(map[string]any)["data"].(map[string]any)["sku"] = "B"
	})
	if _, err := s.VerifyFunc(forged, now, claim); !errors.Is(err, ErrBadSignature) || claimed != 0 {
		t.Fatalf("forged: %v, claimed %d", err, claimed)
	}
	if _, err := s.VerifyFunc(good, later, claim); !errors.Is(err, ErrExpired) || claimed != 0 {
		t.Fatalf("expired: %v, claimed %d", err, claimed)
	}
}
