package orderqueue

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/flashsale/flashsale/internal/sale"
)

// SchemaBatch is the order stream's schema version 2: one message carries
// several reservations of one SKU, a JSON object
//
//	{"reservations": [<version 1 payload>, ...], "traces": [{"traceparent": ...} or null, ...]}
//
// each element of reservations being a version 1 payload (a JSON
// sale.Reservation) as the gate's outbox holds it, traces (absent when no
// reservation of the message was traced) aligned with it. A message costs
// the broker and both clients the same whether it carries one reservation
// or fifty: batching them is what brings the stream's share of a purchase
// down (docs/performance.md).
//
// The consumer decides each reservation of a message on its own (applied,
// refused, or dead-lettered alone as a version 1 dead letter) and acks the
// message once all are decided; a redelivery of a message some of whose
// reservations were applied finds their idempotency rows.
const SchemaBatch = 2

// MaxBatch is the most reservations one version 2 message carries, and
// maxBatchBytes the most payload bytes: a message stays far below the
// broker's 1 MiB max_payload, and a redelivery repeats little.
const (
	MaxBatch      = 64
	maxBatchBytes = 256 << 10
)

// HeaderCount names the number of reservations a version 2 message carries,
// so that the consumer sizes its batches in reservations without decoding.
const HeaderCount = "Flashsale-Count"

// batchV2 is the version 2 payload, as decoded.
type batchV2 struct {
	Reservations []json.RawMessage   `json:"reservations"`
	Traces       []map[string]string `json:"traces,omitempty"`
}

// Part is one reservation a message carries: its version 1 payload, its
// purchase's trace context (nil: none), and the reservation decoded from
// it, or why it could not be.
type Part struct {
	Data        []byte
	Trace       Trace
	Reservation sale.Reservation
	Err         error
	// Batched is set for a reservation taken out of a version 2 payload
	// (Index its position there): its dead letter is a version 1 one of
	// its own.
	Batched bool
	Index   int
}

// Trace is a W3C trace context (traceparent, tracestate) carried with a
// reservation; it reads as tracing.Getter.
type Trace map[string]string

// Get returns the value of key k.
func (t Trace) Get(k string) string { return t[k] }

// DecodeV1 decodes a version 1 payload: one JSON sale.Reservation, validated.
func DecodeV1(data []byte) Part {
	p := Part{Data: data}
	if err := json.Unmarshal(data, &p.Reservation); err != nil {
		p.Err = err
	} else {
		p.Err = p.Reservation.Validate()
	}
	return p
}

// DecodeBatch decodes a version 2 payload into its parts. An error means
// the envelope itself is not version 2 (nothing in it can be trusted); a
// part that does not decode or validate carries its own Err.
func DecodeBatch(data []byte) ([]Part, error) {
	var b batchV2
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("schema 2: %w", err)
	}
	if len(b.Reservations) == 0 {
		return nil, errors.New("schema 2: no reservations")
	}
	if b.Traces != nil && len(b.Traces) != len(b.Reservations) {
		return nil, fmt.Errorf("schema 2: %d traces for %d reservations", len(b.Traces), len(b.Reservations))
	}
	parts := make([]Part, len(b.Reservations))
	for i, raw := range b.Reservations {
		parts[i] = DecodeV1(raw)
		parts[i].Batched, parts[i].Index = true, i
		if b.Traces != nil {
			parts[i].Trace = b.Traces[i]
		}
	}
	return parts, nil
}

// ErrUnknownSchema is Decode's answer for a version this release does not read.
var ErrUnknownSchema = errors.New("orderqueue: unknown schema version")

// Decode decodes a payload of version v (1 or 2) into its parts (see
// DecodeBatch; version 1 has one).
func Decode(v int, data []byte) ([]Part, error) {
	switch v {
	case 1:
		return DecodeV1OrBatch(data), nil
	case SchemaBatch:
		return DecodeBatch(data)
	}
	return nil, ErrUnknownSchema
}

// DecodeV1OrBatch decodes a payload that says it is version 1 (or says
// nothing): one reservation, or, when it is not one and is a version 2
// payload, that payload's reservations. A release before the schema
// header reads a version 2 message as one malformed reservation and
// dead-letters it whole, without the header; its dead letter (and a
// replay of it by that release) reads here as what it carries, so that
// nothing in it is lost or counted as free.
func DecodeV1OrBatch(data []byte) []Part {
	p := DecodeV1(data)
	if p.Err == nil || !bytes.Contains(data, []byte(`"reservations"`)) {
		return []Part{p}
	}
	if parts, err := DecodeBatch(data); err == nil {
		return parts
	}
	return []Part{p}
}

// encodeBatch returns the version 2 payload of msgs (one SKU's, each Data a
// version 1 payload that json.Valid accepts) and its de-duplication id: a
// digest of the order ids, so that the same reservations sent again as one
// message are dropped by the broker, and different ones never are.
func encodeBatch(msgs []Message) (data []byte, id string) {
	n := len(`{"reservations":[]}`)
	traced := false
	for _, m := range msgs {
		n += len(m.Data) + 1
		traced = traced || len(m.Trace) > 0
	}
	var buf bytes.Buffer
	buf.Grow(n)
	buf.WriteString(`{"reservations":[`)
	h := sha256.New()
	for i, m := range msgs {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(m.Data)
		h.Write([]byte(m.ID))
		h.Write([]byte{0})
	}
	buf.WriteByte(']')
	if traced {
		traces := make([]map[string]string, len(msgs))
		for i, m := range msgs {
			if len(m.Trace) > 0 {
				traces[i] = m.Trace
			}
		}
		b, _ := json.Marshal(traces) // a slice of string maps always encodes
		buf.WriteString(`,"traces":`)
		buf.Write(b)
	}
	buf.WriteByte('}')
	return buf.Bytes(), "b2-" + hex.EncodeToString(h.Sum(nil)[:16])
}
