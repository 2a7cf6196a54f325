package demo

import (
	"bytes"
	"strings"
	"testing"
)

// TestDemoTokenHintFromEnv: with FLASHSALE_USER_TOKEN_SECRET set, the demo
// says `flashsale token -user bob` signs with it and does not print it.
func TestDemoTokenHintFromEnv(t *testing.T) {
	var out bytes.Buffer
	c := Config{Base: "http://127.0.0.1:1", UserTokenSecret: "env-s3cr3t", AdminToken: "adm", SKU: "demo-1", Stock: 100, SecretFromEnv: true}
	printTryIt(&out, c)
	if !strings.Contains(out.String(), "\n  go run ./cmd/flashsale token -user bob\n") || strings.Contains(out.String(), "env-s3cr3t") {
		t.Errorf("token hint with the secret from the environment:\n%s", out.String())
	}
	out.Reset()
	c.SecretFromEnv = false
	printTryIt(&out, c)
	if !strings.Contains(out.String(), "\n  go run ./cmd/flashsale token -user-token-secret env-s3cr3t -user bob\n") {
		t.Errorf("token hint with a random secret:\n%s", out.String())
	}
	for _, want := range []string{`-d '{"delta":10}' http://127.0.0.1:1/admin/v1/skus/demo-1/restock`, "-H 'Idempotency-Key: alice-1'"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("printed commands lack %q:\n%s", want, out.String())
		}
	}
}
