package stockgate

import "testing"

// AfterSeedChunk makes Seed call f after each chunk but the last, for the
// test's duration.
func AfterSeedChunk(t *testing.T, f func(i int)) {
	afterSeedChunk = f
	t.Cleanup(func() { afterSeedChunk = nil })
}
