package room

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestAdmissionToken(t *testing.T) {
	r := &Room{cfg: Config{Key: []byte("0123456789abcdef-room")}}
	other := &Room{cfg: Config{Key: []byte("another key of 16+ bytes")}}
	opens := time.Date(2026, 12, 24, 10, 0, 0, 0, time.UTC)
	now := opens.Add(time.Minute)
	exp := now.Add(2 * time.Minute)
	tok := r.sign("sku1", "alice", opens, exp)

	if !strings.HasPrefix(tok, "a1.") || strings.ContainsAny(tok[3:], "+/=.") || len(tok) > 80 {
		t.Fatalf("token %q: want a1. and base64url, short", tok)
	}
	flip := []byte(tok)
	flip[10] ^= 1
	cases := []struct {
		name    string
		tok     string
		sku     string
		user    string
		opens   time.Time
		now     time.Time
		wantErr error
	}{
		{"genuine", tok, "sku1", "alice", opens, now, nil},
		{"just before expiry", tok, "sku1", "alice", opens, exp.Add(-time.Millisecond), nil},
		{"expired", tok, "sku1", "alice", opens, exp, ErrAdmissionExpired},
		{"other buyer", tok, "sku1", "bob", opens, now, ErrNotAdmitted},
		{"other sku", tok, "sku2", "alice", opens, now, ErrNotAdmitted},
		{"rescheduled sale", tok, "sku1", "alice", opens.Add(time.Hour), now, ErrNotAdmitted},
		{"forged by another key", other.sign("sku1", "alice", opens, exp), "sku1", "alice", opens, now, ErrNotAdmitted},
		{"bit flipped", string(flip), "sku1", "alice", opens, now, ErrNotAdmitted},
		{"missing", "", "sku1", "alice", opens, now, ErrNotAdmitted},
		{"no version", tok[3:], "sku1", "alice", opens, now, ErrNotAdmitted},
		{"other version", "a2." + tok[3:], "sku1", "alice", opens, now, ErrNotAdmitted},
		{"truncated", tok[:len(tok)-2], "sku1", "alice", opens, now, ErrNotAdmitted},
		{"padded", tok + "=", "sku1", "alice", opens, now, ErrNotAdmitted},
		// Fields are length-prefixed: moving a byte from SKU to user does not verify.
		{"shifted fields", r.sign("sku1a", "lice", opens, exp), "sku1", "alice", opens, now, ErrNotAdmitted},
	}
	for _, c := range cases {
		if got := r.VerifyAdmission(c.tok, c.sku, c.user, c.opens, c.now); !errors.Is(got, c.wantErr) || (got == nil) != (c.wantErr == nil) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.wantErr)
		}
	}
	// An expired forgery is not admitted, not expired: the MAC is checked first.
	if got := r.VerifyAdmission(other.sign("sku1", "alice", opens, exp), "sku1", "alice", opens, exp.Add(time.Hour)); !errors.Is(got, ErrNotAdmitted) {
		t.Errorf("expired forgery: got %v, want ErrNotAdmitted", got)
	}
}
