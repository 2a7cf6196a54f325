package httpapi

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/sale"
)

func TestDecodeJSON(t *testing.T) {
	cases := []struct {
		body string
		ok   bool
	}{
		{`{"sku_id":"a","quantity":1}`, true},
		{`{"sku_id":"a"}`, true},
		{` {"sku_id":"a","quantity":2} `, true},
		{`{"sku_id":"a","quantity":1,"x":1}`, false},
		{`{"sku_id":"a","quantity":1} x`, false},
		{`{"sku_id":"a","quantity":1}{}`, false},
		{`{"sku_id":1}`, false},
		{`{"quantity":"1"}`, false},
		{`{"quantity":1e400}`, false},
		{`{"quantity":99999999999999999999}`, false},
		{``, false},
		{`null x`, false},
		{strings.Repeat(`{"a":`, 9) + `1` + strings.Repeat(`}`, 9), false},
		{`{"sku_id":"[[[[[[[[[[[[[[[[[[[[[[[["}`, true}, // brackets in strings are not nesting
		{`{"sku_id":"a","sku_id":"b"}`, false},          // which one wins differs between parsers
		{`{"sku_id":"a","SKU_ID":"b"}`, false},          // encoding/json matches keys case-insensitively
		{`{"sku_id":"a","\u017fku_id":"b"}`, false},     // long s folds to s
		{`{"quantity":1,"sku_id":"quantity"}`, true},    // a value equal to a key is no repeat
		{`{"sku_id":"a","quantity":1,"quantity":2}`, false},
		{`{"x":{"a":1,"a":2}}`, false},
		{`{"quantity":NaN}`, false},
		{"\ufeff{\"sku_id\":\"a\"}", false}, // a byte-order mark is not JSON
		{"{\"sku_id\":\"a\xff\"}", true},    // invalid UTF-8 decodes to U+FFFD; the id rules refuse it later
	}
	for _, c := range cases {
		var v orderRequest
		err := decodeJSON([]byte(c.body), &v)
		if (err == nil) != c.ok {
			t.Errorf("%q: err %v, want ok=%v", c.body, err, c.ok)
		}
		if err != nil && !errors.Is(err, sale.ErrInvalid) {
			t.Errorf("%q: error %v is not ErrInvalid", c.body, err)
		}
	}
}

func TestVerifyToken(t *testing.T) {
	a := NewUserAuth("s3cret")
	now := time.Now()
	sign := func(method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(method, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	good, _ := Sign("s3cret", "alice", time.Minute)
	cases := []struct {
		name, tok, user string
	}{
		{"valid", good, "alice"},
		{"within skew", sign(jwt.SigningMethodHS256, []byte("s3cret"), jwt.MapClaims{"sub": "bob", "exp": now.Add(-10 * time.Second).Unix()}), "bob"},
		{"expired beyond skew", sign(jwt.SigningMethodHS256, []byte("s3cret"), jwt.MapClaims{"sub": "bob", "exp": now.Add(-time.Minute).Unix()}), ""},
		{"no exp", sign(jwt.SigningMethodHS256, []byte("s3cret"), jwt.MapClaims{"sub": "bob"}), ""},
		{"wrong secret", sign(jwt.SigningMethodHS256, []byte("other"), jwt.MapClaims{"sub": "bob", "exp": now.Add(time.Minute).Unix()}), ""},
		{"HS512 not allowed", sign(jwt.SigningMethodHS512, []byte("s3cret"), jwt.MapClaims{"sub": "bob", "exp": now.Add(time.Minute).Unix()}), ""},
		{"empty sub", sign(jwt.SigningMethodHS256, []byte("s3cret"), jwt.MapClaims{"exp": now.Add(time.Minute).Unix()}), ""},
		{"not yet valid", sign(jwt.SigningMethodHS256, []byte("s3cret"), jwt.MapClaims{"sub": "bob", "exp": now.Add(time.Hour).Unix(), "nbf": now.Add(time.Hour).Unix()}), ""},
		{"garbage", "a.b.c", ""},
		{"too long", strings.Repeat("a", 5000), ""},
	}
	for _, c := range cases {
		u, err := a.Verify(c.tok)
		if c.user == "" && err == nil {
			t.Errorf("%s: accepted as %q", c.name, u)
		}
		if c.user != "" && (err != nil || u != c.user) {
			t.Errorf("%s: got %q %v, want %q", c.name, u, err, c.user)
		}
	}
}

// FuzzDecodeOrder: the request decoder never panics and either fails with
// ErrInvalid or yields a request the handler can validate; and the purchase
// path's one-pass decoder (decodeOrder) accepts exactly what the strict
// decoder accepts, with the same values, and refuses the rest with the same
// message; the sku_id of a sale in the catalog is the catalog's string, of
// any other a string of its own, with the same value.
func FuzzDecodeOrder(f *testing.F) {
	cat := purchase.NewCatalog(skuList{{ID: "a"}, {ID: "phone-1"}})
	if err := cat.Refresh(context.Background()); err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{`{"sku_id":"a","quantity":1}`, `{"quantity":-1}`, `[`, `{"a":{"b":[1,2,{"c":null}]}}`, `"\u0000"`, `{"sku_id":"\ud800"}`,
		` {"quantity" : 2 , "sku_id" : "phone-1"} `, `{"sku_id":null,"quantity":null}`, `{}`, `null`, `{"sku_id":"a","quantity":1}x`,
		`{"sku_id":"a","quantity":1.0}`, `{"sku_id":"a","quantity":-0}`, `{"sku_id":"a","quantity":123456789012345678}`,
		`{"sku_id":"a","quantity":1234567890123456789}`, `{"sku_id":"a","sku_id":"b"}`, `{"SKU_ID":"a"}`, `{"sku_id":"a\"b"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var v orderRequest
		err := decodeJSON(body, &v)
		if err != nil && !errors.Is(err, sale.ErrInvalid) {
			t.Fatalf("error not ErrInvalid: %v", err)
		}
		if err == nil && !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		in, err2 := decodeOrder(body, cat)
		if (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() {
			t.Fatalf("%q: decodeOrder %v, decodeJSON %v", body, err2, err)
		}
		want := orderInput{SKU: v.SKU, Quantity: 1}
		if v.Quantity != nil {
			want.Quantity = *v.Quantity
		}
		if err == nil && in != want {
			t.Fatalf("%q: decodeOrder %+v, decodeJSON %+v", body, in, want)
		}
		if fast, ok := decodeOrderFast(body, nil); ok && (err != nil || fast != want) {
			t.Fatalf("%q: the fast path took %+v, decodeJSON %+v %v", body, fast, want, err)
		}
		if fast, ok := decodeOrderFast(body, cat); ok {
			if fast != want {
				t.Fatalf("%q: the fast path with the catalog took %+v, decodeJSON %+v", body, fast, want)
			}
			if id, known := cat.ID([]byte(fast.SKU)); known && unsafe.StringData(id) != unsafe.StringData(fast.SKU) {
				t.Fatalf("%q: sku_id %q is a copy of the catalog's", body, fast.SKU)
			}
		}
	})
}

// skuList is a purchase.SKULister of fixed sales.
type skuList []sale.SKU

func (l skuList) SKUs(context.Context) ([]sale.SKU, error) { return l, nil }

// FuzzVerifyToken: token parsing never panics and never accepts a token not
// signed with the secret by HS256: whatever passes carries a valid
// HMAC-SHA256 of its header and claims, a header saying HS256, and an exp.
func FuzzVerifyToken(f *testing.F) {
	good, _ := Sign("k", "alice", time.Hour)
	parts := strings.Split(good, ".")
	for _, s := range []string{good, "", "a.b.c", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.", good + "x",
		parts[0] + "." + parts[1] + ".", "eyJhbGciOiJIUzM4NCJ9." + parts[1] + "." + parts[2], good + "." + good} {
		f.Add(s)
	}
	a := NewUserAuth("k")
	f.Fuzz(func(t *testing.T, tok string) {
		u, err := a.Verify(tok)
		if err != nil {
			if !errors.Is(err, errUnauthenticated) {
				t.Fatalf("error %v is not errUnauthenticated", err)
			}
			return
		}
		p := strings.Split(tok, ".")
		if len(p) != 3 || !sale.ValidUser(u) {
			t.Fatalf("accepted malformed token %q as %q", tok, u)
		}
		sig, err := base64.RawURLEncoding.DecodeString(p[2])
		m := hmac.New(sha256.New, []byte("k"))
		m.Write([]byte(p[0] + "." + p[1]))
		if err != nil || !hmac.Equal(sig, m.Sum(nil)) {
			t.Fatalf("accepted %q as %q without a valid HS256 signature", tok, u)
		}
		var hdr struct {
			Alg string `json:"alg"`
		}
		var claims map[string]any
		hb, _ := base64.RawURLEncoding.DecodeString(p[0])
		cb, _ := base64.RawURLEncoding.DecodeString(p[1])
		if json.Unmarshal(hb, &hdr) != nil || hdr.Alg != "HS256" || json.Unmarshal(cb, &claims) != nil || claims["exp"] == nil {
			t.Fatalf("accepted %q as %q: header %s claims %s", tok, u, hb, cb)
		}
	})
}

// TestDecodeMessages: a refused body is explained in JSON terms (field
// names and JSON types), never with Go's type or package names.
func TestDecodeMessages(t *testing.T) {
	cases := []struct{ body, want string }{
		{`{"stock":"1"}`, `field "stock" must be a whole number in range`},
		{`{"stock":1.5}`, `field "stock" must be a whole number in range`},
		{`{"stock":99999999999999999999}`, `field "stock" must be a whole number in range`},
		{`{"ends_at":5}`, `times must be RFC 3339 strings, e.g. 2026-12-01T12:00:00Z`},
		{`{"ends_at":"soon"}`, `times must be RFC 3339 strings, e.g. 2026-12-01T12:00:00Z`},
		{`{"colour":1}`, `unknown field "colour"`},
		{`{"stock":1,`, `the body is empty or ends early`},
		{``, `the body is empty or ends early`},
		{`{"stock":}`, `malformed JSON at byte 10`},
		{`[1]`, `the body must be a JSON object`},
		{`{"stock":1} x`, `trailing data after the JSON object`},
		{`{"stock":1,"Stock":2}`, `key "Stock" appears more than once`},
	}
	for _, c := range cases {
		var v putSKURequest
		err := decodeJSON([]byte(c.body), &v)
		var pe *publicError
		if !errors.As(err, &pe) || !errors.Is(err, sale.ErrInvalid) {
			t.Errorf("%q: %v, want a public invalid_request", c.body, err)
			continue
		}
		if pe.msg != c.want {
			t.Errorf("%q: message %q, want %q", c.body, pe.msg, c.want)
		}
	}
}
