// Package testenv gives tests their own isolated piece of the real services:
// a fresh PostgreSQL database, a private Redis key prefix (or a private
// redis-server), and an in-process NATS JetStream server.
//
// A service that cannot be reached makes the test skip locally, and fail when
// FLASHSALE_TEST_REQUIRE_SERVICES is set (CI sets it: CI makes the services exist).
package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
)

// Required reports whether tests must fail, not skip, when a service is missing.
func Required() bool { return os.Getenv("FLASHSALE_TEST_REQUIRE_SERVICES") != "" }

// Unavailable ends the test because service cannot be used: a skip locally,
// a failure when Required.
func Unavailable(t testing.TB, service string, err error) {
	t.Helper()
	if Required() {
		t.Fatalf("%s required (FLASHSALE_TEST_REQUIRE_SERVICES is set) but unavailable: %v", service, err)
	}
	t.Skipf("%s unavailable, skipping (set FLASHSALE_TEST_REQUIRE_SERVICES=1 to fail instead): %v", service, err)
}

// RandomName returns prefix followed by 12 random lower-case hex digits.
func RandomName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

func getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
