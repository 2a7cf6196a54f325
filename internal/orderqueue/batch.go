package orderqueue

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"

	"github.com/flashsale/flashsale/internal/sale"
)

// SchemaBatch is the order stream's schema version 2: one message carries
// several reservations of one SKU, their version 1 payloads (each a JSON
// sale.Reservation as the gate's outbox holds it, which never holds a
// newline) one per line:
//
//	<version 1 payload>\n<version 1 payload>\n...
//
// with the headers HeaderCount (how many) and, when any of them was traced,
// HeaderTraces. A message costs the broker and both clients the same
// whether it carries one reservation or fifty: batching them is what brings
// the stream's share of a purchase down (docs/performance.md). Lines keep
// each reservation's bytes apart: reading one costs what a version 1
// message costs, and a damaged line spoils only its own reservation.
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

// Headers of a version 2 message.
const (
	// HeaderCount names the number of reservations it carries, so that
	// the consumer sizes its batches in reservations without decoding.
	HeaderCount = "Flashsale-Count"
	// HeaderTraces holds, when any of its reservations was traced, a JSON
	// array aligned with its lines: each purchase's W3C trace context
	// ({"traceparent": ..., "tracestate": ...}) or null.
	HeaderTraces = "Flashsale-Traces"
)

// Part is one reservation a message carries: its version 1 payload, its
// purchase's trace context (nil: none), and the reservation decoded from
// it, or why it could not be.
type Part struct {
	Data        []byte
	Trace       Trace
	Reservation sale.Reservation
	Err         error
	// Batched is set for a reservation taken out of a version 2 payload
	// (Index its line there): its dead letter is a version 1 one of its
	// own.
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

// DecodeBatch decodes a version 2 payload into its parts, one per line;
// traces is its HeaderTraces ("" for none; one that does not match its
// lines is ignored: traces are not worth a reservation). An error only for
// an empty payload; a line that does not decode or validate carries its own
// Err.
func DecodeBatch(data []byte, traces string) ([]Part, error) {
	if len(data) == 0 {
		return nil, errors.New("schema 2: no reservations")
	}
	lines := bytes.Split(data, []byte{'\n'})
	parts := make([]Part, len(lines))
	for i, line := range lines {
		parts[i] = DecodeV1(line)
		if len(line) == 0 {
			parts[i].Err = errors.New("schema 2: an empty line")
		}
		parts[i].Batched, parts[i].Index = true, i
	}
	if traces != "" {
		var ts []map[string]string
		if json.Unmarshal([]byte(traces), &ts) == nil && len(ts) == len(parts) {
			for i, t := range ts {
				if len(t) > 0 {
					parts[i].Trace = t
				}
			}
		}
	}
	return parts, nil
}

// ErrUnknownSchema is Decode's answer for a version this release does not read.
var ErrUnknownSchema = errors.New("orderqueue: unknown schema version")

// Decode decodes a payload of version v (1 or 2) into its parts (see
// DecodeBatch, traces its HeaderTraces; version 1 has one).
func Decode(v int, data []byte, traces string) ([]Part, error) {
	switch v {
	case 1:
		return DecodeV1OrBatch(data), nil
	case SchemaBatch:
		return DecodeBatch(data, traces)
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
	if p.Err == nil || bytes.IndexByte(data, '\n') < 0 {
		return []Part{p}
	}
	// Lines, if any of them is a reservation: a broken version 1 payload
	// that happens to span lines stays one malformed reservation.
	if parts, err := DecodeBatch(data, ""); err == nil {
		for _, bp := range parts {
			if bp.Err == nil {
				return parts
			}
		}
	}
	return []Part{p}
}

// encodeBatch returns the version 2 payload of msgs (one SKU's, each Data
// a version 1 payload without a newline), its HeaderTraces ("" when none is
// traced) and its de-duplication id: a digest of the order ids, so that the
// same reservations sent again as one message are dropped by the broker,
// and different ones never are.
func encodeBatch(msgs []Message) (data []byte, traces, id string) {
	n := 0
	traced := false
	for _, m := range msgs {
		n += len(m.Data) + 1
		traced = traced || len(m.Trace) > 0
	}
	data = make([]byte, 0, n)
	h := sha256.New()
	for i, m := range msgs {
		if i > 0 {
			data = append(data, '\n')
		}
		data = append(data, m.Data...)
		h.Write([]byte(m.ID))
		h.Write([]byte{0})
	}
	if traced {
		ts := make([]map[string]string, len(msgs))
		for i, m := range msgs {
			if len(m.Trace) > 0 {
				ts[i] = m.Trace
			}
		}
		b, _ := json.Marshal(ts) // a slice of string maps always encodes
		traces = string(b)
	}
	return data, traces, "b2-" + hex.EncodeToString(h.Sum(nil)[:16])
}
