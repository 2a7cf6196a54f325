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
	if !strings.Contains(out.String(), "\n  flashsale token -user bob\n") || strings.Contains(out.String(), "env-s3cr3t") {
		t.Errorf("token hint with the secret from the environment:\n%s", out.String())
	}
	out.Reset()
	c.SecretFromEnv = false
	printTryIt(&out, c)
	if !strings.Contains(out.String(), "\n  flashsale token -user-token-secret env-s3cr3t -user bob\n") {
		t.Errorf("token hint with a random secret:\n%s", out.String())
	}
	if !strings.Contains(out.String(), `"stock":110,"per_user_limit":1,"ends_at":"`) {
		t.Errorf("restock command of a 100-unit sale:\n%s", out.String())
	}
}
