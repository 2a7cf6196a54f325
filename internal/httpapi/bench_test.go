package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkDecode is the strict decode of a purchase body (depth check,
// unknown fields refused, trailing data refused): once per purchase.
func BenchmarkDecode(b *testing.B) {
	body := []byte(`{"sku_id":"phone-2026-flash","quantity":1}`)
	b.ReportAllocs()
	for b.Loop() {
		var v orderRequest
		if err := decodeJSON(body, &v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeOrder is the purchase path's one-pass decode of the same
// body (decodeOrder), read from the request into a pooled buffer.
func BenchmarkDecodeOrder(b *testing.B) {
	body := []byte(`{"sku_id":"phone-2026-flash","quantity":1}`)
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/api/v1/orders", nil)
	r.Header.Set("Content-Type", "application/json")
	rd := &benchBody{}
	r.Body, r.ContentLength = rd, int64(len(body))
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		raw, buf, err := readPooled(w, r)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := decodeOrder(raw, nil); err != nil {
			b.Fatal(err)
		}
		bodyBufs.Put(buf)
	}
}

// BenchmarkDecodeRequest adds what decode does around it: Content-Type,
// the body size limit and reading the body.
func BenchmarkDecodeRequest(b *testing.B) {
	const body = `{"sku_id":"phone-2026-flash","quantity":1}`
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/api/v1/orders", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		var v orderRequest
		if err := decode(w, r, &v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyToken is the check of a buyer's JWT (HS256): once per
// purchase. Sequential and with every CPU busy (RunParallel).
func BenchmarkVerifyToken(b *testing.B) {
	const secret = "bench-secret-of-reasonable-length"
	tok, err := Sign(secret, "user-12345", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	a := NewUserAuth(secret)
	b.Run("sequential", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := a.Verify(tok); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := a.Verify(tok); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	// A token of another shape (aud a list) goes to golang-jwt.
	other := signRaw(secret, []byte(`{"alg":"HS256","typ":"JWT"}`),
		[]byte(`{"sub":"user-12345","aud":["flashsale"],"exp":`+strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)+`}`))
	b.Run("other-shape", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := a.Verify(other); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The reference: golang-jwt on the token of the first two.
	b.Run("golang-jwt", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := verifyWithJWT(secret, time.Now(), tok); !ok {
				b.Fatal("refused")
			}
		}
	})
}
