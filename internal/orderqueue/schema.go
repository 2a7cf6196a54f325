package orderqueue

import (
	"strconv"

	"github.com/nats-io/nats.go"
)

// SchemaHeader names the schema version of a message's payload, on every
// stream flashsale publishes to (orders, dead letters, events). It is
// flashsale's own header: Nats- names belong to the server.
//
// A message without it is version 1 (what releases before the header
// published). A release that changes a payload's format publishes it under
// a new version only once no instance of the previous release runs; until
// then it publishes the old version and reads both (docs/releasing.md).
const SchemaHeader = "Flashsale-Schema"

// SchemaVersion is the version of the payloads this release publishes: a
// JSON sale.Reservation on the order and dead-letter streams, an order
// event on the event stream.
const SchemaVersion = 1

// SchemaOf returns the schema version of a message with headers h: 1 if the
// header is missing (the previous release's messages), and ok false if it is
// not a positive number (a version this release cannot know either).
func SchemaOf(h nats.Header) (v int, ok bool) {
	s := h.Get(SchemaHeader)
	if s == "" {
		return 1, true
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		return 0, false
	}
	return v, true
}

// setSchema marks msg with version v (SchemaVersion when "").
func setSchema(msg *nats.Msg, v string) {
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	if v == "" {
		v = strconv.Itoa(SchemaVersion)
	}
	msg.Header.Set(SchemaHeader, v)
}
