package sale

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// The specification of the id checks: the byte loops must agree with these.
var (
	skuSpec   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	userSpec  = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,128}$`)
	orderSpec = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	idemSpec  = regexp.MustCompile(`^[\x21-\x7e]{1,128}$`)
)

func checkAgainstSpec(t *testing.T, s string) {
	t.Helper()
	for _, c := range []struct {
		name string
		got  bool
		want bool
	}{
		{"ValidSKU", ValidSKU(s), skuSpec.MatchString(s)},
		{"ValidUser", ValidUser(s), userSpec.MatchString(s)},
		{"ValidOrderID", ValidOrderID(s), orderSpec.MatchString(s)},
		{"ValidIdempotencyKey", ValidIdempotencyKey(s), idemSpec.MatchString(s)},
	} {
		if c.got != c.want {
			t.Fatalf("%s(%q) = %v, the pattern says %v", c.name, s, c.got, c.want)
		}
	}
}

func TestValidatorsMatchPatterns(t *testing.T) {
	edge := []string{"", "a", "A-z_9", strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("u", 128),
		strings.Repeat("u", 129), "a b", "a\n", "a\x00", "é", "user@example.com", "a.b", "a/b", "~!", "\x7f",
		"0190a5b2-7c3d-4e5f-8a9b-0c1d2e3f4a5b", "0190A5B2-7c3d-4e5f-8a9b-0c1d2e3f4a5b", "0190a5b2-7c3d-4e5f-8a9b-0c1d2e3f4a5",
		"0190a5b2_7c3d-4e5f-8a9b-0c1d2e3f4a5b", "0190a5b2-7c3d-4e5f-8a9b-0c1d2e3f4a5b\n"}
	for _, s := range edge {
		checkAgainstSpec(t, s)
	}
	alphabet := "aZ09_-.@ -/\x00\x7f\xffé\n" + "0123456789abcdef"
	r := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		n := r.IntN(140)
		var b strings.Builder
		for range n {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		checkAgainstSpec(t, b.String())
	}
	// UUID-shaped strings with one byte changed.
	base := []byte("0190a5b2-7c3d-4e5f-8a9b-0c1d2e3f4a5b")
	for i := range base {
		for _, c := range []byte{'-', 'g', 'A', '0', 'f', ' '} {
			b := append([]byte(nil), base...)
			b[i] = c
			checkAgainstSpec(t, string(b))
		}
	}
}

func FuzzValidatorsMatchPatterns(f *testing.F) {
	f.Add("0190a5b2-7c3d-4e5f-8a9b-0c1d2e3f4a5b")
	f.Add("user@example.com")
	f.Fuzz(func(t *testing.T, s string) { checkAgainstSpec(t, s) })
}

func BenchmarkValidators(b *testing.B) {
	id, user, sku := "0190a5b2-7c3d-4e5f-8a9b-0c1d2e3f4a5b", "buyer-123456@example.com", "phone-2026"
	b.Run("loops", func(b *testing.B) {
		for b.Loop() {
			_ = ValidOrderID(id) && ValidUser(user) && ValidSKU(sku)
		}
	})
	b.Run("regexps", func(b *testing.B) {
		for b.Loop() {
			_ = orderSpec.MatchString(id) && userSpec.MatchString(user) && skuSpec.MatchString(sku)
		}
	})
}
