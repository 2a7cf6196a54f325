package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-cmp/cmp"
)

// state is everything a purchase could change, read from Redis and PostgreSQL.
type state struct {
	Redis map[string]string
	DB    []string
}

func snapshot(t *testing.T, h *harness, skus ...string) state {
	t.Helper()
	ctx := context.Background()
	s := state{Redis: map[string]string{}}
	c := h.a.redis
	for _, sku := range skus {
		k := h.a.gate.KeysOf(sku)
		for _, key := range []string{k.Meta, k.Buyers, k.Res, k.Idem} {
			m, err := c.Do(ctx, c.B().Hgetall().Key(key).Build()).AsStrMap()
			if err != nil {
				t.Fatal(err)
			}
			s.Redis[key] = fmt.Sprint(m)
		}
		ids, err := c.Do(ctx, c.B().Zrange().Key(k.Outbox).Min("0").Max("-1").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		s.Redis[k.Outbox] = fmt.Sprint(ids)
	}
	for _, q := range []string{
		"SELECT sku_id || ':' || stock || ':' || total_stock || ':' || per_user_limit FROM inventory ORDER BY sku_id",
		"SELECT concat(order_id, ':', status) FROM orders ORDER BY order_id",
		"SELECT tx_id FROM process_log ORDER BY tx_id",
	} {
		rows, err := h.a.store.DB().QueryContext(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var v string
			if err := rows.Scan(&v); err != nil {
				t.Fatal(err)
			}
			s.DB = append(s.DB, v)
		}
		rows.Close()
	}
	return s
}

func signed(t *testing.T, secret string, claims jwt.MapClaims) string {
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func signedWith(t *testing.T, m jwt.SigningMethod, secret string, claims jwt.MapClaims) string {
	tok, err := jwt.NewWithClaims(m, claims).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// lyingAlg returns a token whose header names alg but whose signature is
// HMAC-SHA256 with secret (an algorithm-confusion forgery).
func lyingAlg(secret, alg, claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	body := enc([]byte(`{"alg":"`+alg+`","typ":"JWT"}`)) + "." + enc([]byte(claims))
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return body + "." + enc(m.Sum(nil))
}

// TestBadInputChangesNothing: every kind of bad request gets its 4xx with a
// machine-readable code, and leaves Redis and PostgreSQL exactly as they were.
func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("s", 5, 2)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	pastStart := time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339)
	// Set-up PUTs, sent again while 503 (a sale's first load can outlast
	// the request on a busy machine): a PUT is a replacement, and a repeat
	// of one that was saved answers 200.
	admin := "Authorization: Bearer " + testAdmin
	if r := h.doUntilAnswered(http.MethodPut, "/admin/v1/skus/later", `{"stock":5,"per_user_limit":1,"starts_at":"`+future+`"}`, admin); r.Status != http.StatusCreated && r.Status != http.StatusOK {
		t.Fatal(r.Raw)
	}
	if r := h.doUntilAnswered(http.MethodPut, "/admin/v1/skus/over", `{"stock":5,"per_user_limit":1,"starts_at":"`+pastStart+`","ends_at":"`+past+`"}`, admin); r.Status != http.StatusCreated && r.Status != http.StatusOK {
		t.Fatal(r.Raw)
	}
	// One real purchase so the state is not trivially empty.
	first := h.buy("alice", "s", 1, "k1")
	if first.Status != http.StatusAccepted {
		t.Fatal(first.Raw)
	}
	alices := "/api/v1/orders/" + first.str("order_id")
	settle(t, h.a, "s", nil, 20*time.Second)
	before := snapshot(t, h, "s", "later", "over")

	auth := "Authorization: Bearer " + userToken(t, "bob")
	exp := time.Now().Add(time.Hour).Unix()
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"sub":"bob","exp":%d}`, exp))) + "."
	cases := []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code                     string
	}{
		{"malformed json", "POST", "/api/v1/orders", `{"sku_id":`, []string{auth}, 400, "invalid_request"},
		{"not an object", "POST", "/api/v1/orders", `[1,2]`, []string{auth}, 400, "invalid_request"},
		{"unknown field", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1,"price":0}`, []string{auth}, 400, "invalid_request"},
		{"trailing data", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}{"sku_id":"s"}`, []string{auth}, 400, "invalid_request"},
		{"wrong type", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":"1"}`, []string{auth}, 400, "invalid_request"},
		{"fractional quantity", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1.5}`, []string{auth}, 400, "invalid_request"},
		{"deep nesting", "POST", "/api/v1/orders", strings.Repeat("[", 100) + strings.Repeat("]", 100), []string{auth}, 400, "invalid_request"},
		{"zero quantity", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":0}`, []string{auth}, 400, "invalid_request"},
		{"negative quantity", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":-5}`, []string{auth}, 400, "invalid_request"},
		{"huge quantity", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":101}`, []string{auth}, 400, "invalid_request"},
		{"overflowing quantity", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":9223372036854775808}`, []string{auth}, 400, "invalid_request"},
		{"exponent quantity", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1e30}`, []string{auth}, 400, "invalid_request"},
		{"over per-user limit", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":3}`, []string{auth}, 409, "limit_reached"},
		{"unknown sku", "POST", "/api/v1/orders", `{"sku_id":"nope","quantity":1}`, []string{auth}, 404, "unknown_sku"},
		{"odd sku id", "POST", "/api/v1/orders", `{"sku_id":"s' OR 1=1 --","quantity":1}`, []string{auth}, 400, "invalid_request"},
		{"missing sku id", "POST", "/api/v1/orders", `{"quantity":1}`, []string{auth}, 400, "invalid_request"},
		{"sale not started", "POST", "/api/v1/orders", `{"sku_id":"later","quantity":1}`, []string{auth}, 409, "sale_not_started"},
		{"sale ended", "POST", "/api/v1/orders", `{"sku_id":"over","quantity":1}`, []string{auth}, 409, "sale_ended"},
		{"bad idempotency key", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{auth, "Idempotency-Key: " + strings.Repeat("k", 200)}, 400, "invalid_request"},
		{"missing token", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, nil, 401, "unauthenticated"},
		{"not bearer", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{"Authorization: Basic Ym9iOmJvYg=="}, 401, "unauthenticated"},
		{"forged token", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{"Authorization: Bearer " + signed(t, "wrong-secret", jwt.MapClaims{"sub": "bob", "exp": exp})}, 401, "unauthenticated"},
		{"alg none", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{"Authorization: Bearer " + none}, 401, "unauthenticated"},
		{"expired token", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{"Authorization: Bearer " + signed(t, testSecret, jwt.MapClaims{"sub": "bob", "exp": time.Now().Add(-time.Hour).Unix()})}, 401, "unauthenticated"},
		{"token without exp", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{"Authorization: Bearer " + signed(t, testSecret, jwt.MapClaims{"sub": "bob"})}, 401, "unauthenticated"},
		{"token with odd sub", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{"Authorization: Bearer " + signed(t, testSecret, jwt.MapClaims{"sub": "bob smith<script>", "exp": exp})}, 401, "unauthenticated"},
		{"no content type", "POST", "/api/v1/orders", ``, []string{auth}, 415, "unsupported_media_type"},
		{"text content type", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{auth, "Content-Type: text/plain"}, 415, "unsupported_media_type"},
		{"oversized body", "POST", "/api/v1/orders", `{"sku_id":"` + strings.Repeat("s", 10000) + `","quantity":1}`, []string{auth}, 413, "body_too_large"},
		{"wrong method", "DELETE", "/api/v1/orders", ``, []string{auth}, 405, "method_not_allowed"},
		{"unknown path", "GET", "/api/v1/nothing", ``, nil, 404, "not_found"},
		{"bad order id", "GET", "/api/v1/orders/../../etc", ``, []string{auth}, 404, ""},
		{"someone else's order", "GET", "/api/v1/orders/01890000-0000-7000-8000-000000000000", ``, []string{auth}, 404, "order_not_found"},
		{"unknown sku view", "GET", "/api/v1/skus/nope", ``, nil, 404, "unknown_sku"},
		{"admin without token", "PUT", "/admin/v1/skus/s", `{"stock":50,"per_user_limit":1}`, nil, 401, "unauthenticated"},
		{"admin wrong token", "PUT", "/admin/v1/skus/s", `{"stock":50,"per_user_limit":1}`, []string{"Authorization: Bearer nope"}, 401, "unauthenticated"},
		{"admin user token", "PUT", "/admin/v1/skus/s", `{"stock":50,"per_user_limit":1}`, []string{auth}, 401, "unauthenticated"},
		{"admin negative stock", "PUT", "/admin/v1/skus/s", `{"stock":-1,"per_user_limit":1}`, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
		{"admin missing limit", "PUT", "/admin/v1/skus/s", `{"stock":5}`, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
		{"admin window backwards", "PUT", "/admin/v1/skus/s", `{"stock":5,"per_user_limit":2,"starts_at":"` + future + `","ends_at":"` + past + `"}`, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
		{"admin bad time", "PUT", "/admin/v1/skus/s", `{"stock":5,"per_user_limit":2,"starts_at":"tomorrow"}`, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
		{"admin bad sku id", "PUT", "/admin/v1/skus/a.b", `{"stock":5,"per_user_limit":2}`, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
		{"admin reduce below sold", "PUT", "/admin/v1/skus/s", `{"stock":0,"per_user_limit":2}`, []string{"Authorization: Bearer " + testAdmin}, 409, "stock_conflict"},
		{"warmup unknown sku", "POST", "/admin/v1/skus/nope/warmup", ``, []string{"Authorization: Bearer " + testAdmin}, 404, "unknown_sku"},
		{"duplicate key", "POST", "/api/v1/orders", `{"sku_id":"s","sku_id":"nope","quantity":1}`, []string{auth}, 400, "invalid_request"},
		{"case-folded duplicate key", "POST", "/api/v1/orders", `{"sku_id":"s","SKU_ID":"s","quantity":1}`, []string{auth}, 400, "invalid_request"},
		{"null body", "POST", "/api/v1/orders", `null`, []string{auth}, 400, "invalid_request"},
		{"empty json body", "POST", "/api/v1/orders", ``, []string{auth, "Content-Type: application/json"}, 400, "invalid_request"},
		{"NaN quantity", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":NaN}`, []string{auth}, 400, "invalid_request"},
		{"object quantity", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":{}}`, []string{auth}, 400, "invalid_request"},
		{"sku id too long", "POST", "/api/v1/orders", `{"sku_id":"` + strings.Repeat("s", 65) + `","quantity":1}`, []string{auth}, 400, "invalid_request"},
		{"full-width sku id", "POST", "/api/v1/orders", `{"sku_id":"ｓ","quantity":1}`, []string{auth}, 400, "invalid_request"},
		{"invalid utf-8 sku id", "POST", "/api/v1/orders", "{\"sku_id\":\"s\xff\",\"quantity\":1}", []string{auth}, 400, "invalid_request"},
		{"json-like content type", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{auth, "Content-Type: application/json-patch+json"}, 415, "unsupported_media_type"},
		{"idempotency key with a space", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{auth, "Idempotency-Key: a b"}, 400, "invalid_request"},
		{"user header without a gateway", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{"X-User-Id: alice"}, 401, "unauthenticated"},
		{"HS384 token", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{"Authorization: Bearer " + signedWith(t, jwt.SigningMethodHS384, testSecret, jwt.MapClaims{"sub": "bob", "exp": exp})}, 401, "unauthenticated"},
		{"RS256 header, HMAC signature", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{"Authorization: Bearer " + lyingAlg(testSecret, "RS256", fmt.Sprintf(`{"sub":"bob","exp":%d}`, exp))}, 401, "unauthenticated"},
		{"token signed with the admin token", "POST", "/api/v1/orders", `{"sku_id":"s","quantity":1}`, []string{"Authorization: Bearer " + signed(t, testAdmin, jwt.MapClaims{"sub": "bob", "exp": exp})}, 401, "unauthenticated"},
		{"token in the query string", "POST", "/api/v1/orders?access_token=" + userToken(t, "bob"), `{"sku_id":"s","quantity":1}`, nil, 401, "unauthenticated"},
		{"read another's order", "GET", alices, ``, []string{auth}, 404, "order_not_found"},
		{"cancel another's order", "POST", alices + "/cancel", ``, []string{auth}, 404, "order_not_found"},
		{"pay another's order", "POST", alices + "/pay", ``, []string{auth}, 404, "order_not_found"},
		{"cancel a malformed order id", "POST", "/api/v1/orders/not-an-id/cancel", ``, []string{auth}, 404, "order_not_found"},
		{"sku view with an odd id", "GET", "/api/v1/skus/s%27%20OR%201=1", ``, nil, 400, "invalid_request"},
		{"sku view with a long id", "GET", "/api/v1/skus/" + strings.Repeat("s", 65), ``, nil, 400, "invalid_request"},
		{"admin sku with an odd id", "GET", "/admin/v1/skus/s%27", ``, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
		{"patch with an odd id", "PATCH", "/admin/v1/skus/s%27", `{"stock":1}`, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
		{"restock with an odd id", "POST", "/admin/v1/skus/s%27/restock", `{"delta":1}`, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
		{"warmup with an odd id", "POST", "/admin/v1/skus/s%27/warmup", ``, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
		{"audit with an odd id", "GET", "/admin/v1/skus/s%27/audit", ``, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
		{"put with an odd id", "PUT", "/admin/v1/skus/s%27", `{"stock":1,"per_user_limit":1}`, []string{"Authorization: Bearer " + testAdmin}, 400, "invalid_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := h.do(c.method, c.path, c.body, c.headers...)
			if r.Status != c.status || (c.code != "" && r.code() != c.code) {
				t.Errorf("got %d %s, want %d %s", r.Status, r.Raw, c.status, c.code)
			}
			if r.Status >= 400 {
				if msg, _ := r.Body["error"].(map[string]any)["message"].(string); msg == "" {
					t.Errorf("error without a message: %s", r.Raw)
				}
			}
		})
	}
	after := snapshot(t, h, "s", "later", "over")
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("bad input changed state (-before +after):\n%s", diff)
	}
}

// TestIdempotencyKey: a retry with the same key returns the same order and
// takes nothing more.
func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t, "external"))
	h.mustPutSKU("s", 10, 5)
	first := h.buy("carol", "s", 2, "checkout-42")
	if first.Status != http.StatusAccepted {
		t.Fatal(first.Raw)
	}
	for i := 0; i < 3; i++ {
		again := h.buy("carol", "s", 2, "checkout-42")
		if !purchaseAccepted(again) || again.str("order_id") != first.str("order_id") {
			t.Fatalf("retry %d: %d %s, want order %s", i, again.Status, again.Raw, first.str("order_id"))
		}
	}
	rep := settle(t, h.a, "s", []string{first.str("order_id")}, 20*time.Second)
	if rep.LiveUnits != 2 || rep.Orders != 1 {
		t.Fatalf("after retries: %+v", rep)
	}
}
