package room

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strings"
	"time"
)

// Admission tokens are "a1." + base64url(expiry || mac) without padding:
// expiry is the unix milliseconds as 8 bytes big-endian, mac the
// HMAC-SHA256 under Config.Key of the version, SKU, buyer, the sale's
// opening (so a rescheduled sale's tokens stop verifying) and the expiry,
// each length-prefixed. 57 ASCII characters, safe in URLs and headers.
const tokenPrefix = "a1."

func (r *Room) mac(sku, user string, opensAt time.Time, exp int64) []byte {
	m := hmac.New(sha256.New, r.cfg.Key)
	field := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		m.Write(n[:])
		m.Write(b)
	}
	field([]byte("flashsale room admission a1"))
	field([]byte(sku))
	field([]byte(user))
	field([]byte(ms(opensAt)))
	var e [8]byte
	binary.BigEndian.PutUint64(e[:], uint64(exp))
	field(e[:])
	return m.Sum(nil)
}

func (r *Room) sign(sku, user string, opensAt, expires time.Time) string {
	exp := expires.UnixMilli()
	b := make([]byte, 8, 8+sha256.Size)
	binary.BigEndian.PutUint64(b, uint64(exp))
	b = append(b, r.mac(sku, user, opensAt, exp)...)
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// VerifyAdmission checks, in memory (no Redis), that token admits user to
// buy sku in the sale opening at opensAt at time now. It returns
// ErrNotAdmitted for a missing, malformed or forged token and for one
// issued to another buyer, SKU or opening, ErrAdmissionExpired for a
// genuine one at or after its expiry, and nil otherwise.
func (r *Room) VerifyAdmission(token, sku, user string, opensAt, now time.Time) error {
	body, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok {
		return ErrNotAdmitted
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(body)
	if err != nil || len(b) != 8+sha256.Size {
		return ErrNotAdmitted
	}
	exp := int64(binary.BigEndian.Uint64(b))
	if !hmac.Equal(b[8:], r.mac(sku, user, opensAt, exp)) {
		return ErrNotAdmitted
	}
	if now.UnixMilli() >= exp {
		return ErrAdmissionExpired
	}
	return nil
}
