package httpapi

import (
	"encoding/json"
	"testing"
)

// TestPlainJSON: a byte plainJSON passes is one encoding/json writes as it
// is between quotes, so writeAccepted's bytes are writeJSON's; it passes
// every printable ASCII byte but " \ < > & (DEL it leaves to writeJSON).
func TestPlainJSON(t *testing.T) {
	for c := 0; c < 256; c++ {
		s := string([]byte{byte(c)})
		j, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		asIs := string(j) == `"`+s+`"`
		if want := asIs && c >= 0x20 && c < 0x7f; plainJSON(s) != want {
			t.Errorf("byte %#x: plainJSON %v, encoding/json writes %s", c, plainJSON(s), j)
		}
	}
}
