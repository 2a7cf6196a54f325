package stockgate

import (
	"encoding/hex"
	"hash/fnv"

	"github.com/google/uuid"
)

// Order ids are UUIDs laid out as version 7 (48 bits of Unix ms, then 12
// bits of sub-millisecond sequence and 46 random bits) marked version 8
// (RFC 9562's custom version), whose last 16 bits are the tag of the SKU
// (SKUTag). The tag lets a look-up find the SKU whose Redis keys hold an order
// still in flight without asking every SKU: one Redis call, and a cluster
// slot known from the id. To clients an id stays an opaque lower-case
// UUID; ids made before (plain version 7) carry no tag.

// SKUTag is the 16-bit tag of sku carried by its order ids (FNV-1a).
func SKUTag(sku string) uint16 {
	h := fnv.New32a()
	h.Write([]byte(sku))
	s := h.Sum32()
	return uint16(s ^ s>>16)
}

// NewOrderID returns a new order id for sku, tagged with SKUTag(sku).
func NewOrderID(sku string) string {
	u := uuid.Must(uuid.NewV7())
	u[6] = u[6]&0x0f | 0x80 // version 8
	t := SKUTag(sku)
	u[14], u[15] = byte(t>>8), byte(t)
	return u.String()
}

// OrderTag returns the SKU tag id carries, and false for an id without one
// (not a version 8 UUID: made before tags, or not an order id of ours).
func OrderTag(id string) (uint16, bool) {
	if len(id) != 36 || id[14] != '8' {
		return 0, false
	}
	var b [2]byte
	if _, err := hex.Decode(b[:], []byte(id[32:36])); err != nil {
		return 0, false
	}
	return uint16(b[0])<<8 | uint16(b[1]), true
}
