package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/purchase"
	"github.com/flashsale/flashsale/internal/sale"
)

// maxBody bounds every request body; a larger one is 413 body_too_large.
const maxBody = 8 << 10

// maxDepth bounds JSON nesting; deeper documents are refused before decoding.
const maxDepth = 8

// decode reads a strict JSON object into v: Content-Type application/json,
// at most maxBody bytes, no unknown fields, no repeated keys, no trailing
// data, bounded depth.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := readBody(w, r, "application/json")
	if err != nil {
		return err
	}
	return decodeJSON(body, v)
}

// readBody checks that the Content-Type is one of types and reads at most
// maxBody bytes.
func readBody(w http.ResponseWriter, r *http.Request, types ...string) ([]byte, error) {
	if !mediaTypeIn(r, types) {
		return nil, errMediaType
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return nil, bodyError(err)
	}
	return body, nil
}

func mediaTypeIn(r *http.Request, types []string) bool {
	ct := headerValue(r.Header, "Content-Type")
	if len(types) == 1 && strings.EqualFold(ct, types[0]) {
		return true // the usual case, which ParseMediaType would accept
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && slices.Contains(types, mt)
}

func bodyError(err error) error {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return errTooLarge
	}
	return &publicError{base: fmt.Errorf("%w: reading body: %w", sale.ErrInvalid, err), msg: "The request body could not be read."}
}

// bodyBuf is a pooled buffer a body is read into (readPooled).
type bodyBuf struct{ b [maxBody + 1]byte }

var bodyBufs = sync.Pool{New: func() any { return new(bodyBuf) }}

// readPooled is readBody("application/json") into a pooled buffer, to be
// given back with bodyBufs.Put once the body is decoded (buf is nil when
// the body was read another way). A body whose length is declared within
// maxBody is read as it is; others go through http.MaxBytesReader as in
// readBody.
func readPooled(w http.ResponseWriter, r *http.Request) (body []byte, buf *bodyBuf, err error) {
	if r.ContentLength < 0 || r.ContentLength > maxBody {
		body, err = readBody(w, r, "application/json")
		return body, nil, err
	}
	if !mediaTypeIn(r, []string{"application/json"}) {
		return nil, nil, errMediaType
	}
	buf = bodyBufs.Get().(*bodyBuf)
	n := 0
	for n < len(buf.b) {
		var m int
		m, err = r.Body.Read(buf.b[n:])
		n += m
		if err != nil {
			break
		}
	}
	switch {
	case err != nil && err != io.EOF:
		bodyBufs.Put(buf)
		return nil, nil, bodyError(err)
	case n > maxBody:
		bodyBufs.Put(buf)
		return nil, nil, errTooLarge
	}
	return buf.b[:n], buf, nil
}

// orderInput is a decoded purchase body: Quantity 1 when absent or null.
type orderInput struct {
	SKU      string
	Quantity int64
}

// decodeOrder reads the body of POST /api/v1/orders as decode would into an
// orderRequest, in one pass over it. A body in the form clients send (the
// two keys spelt as documented, each at most once, a plain printable ASCII
// sku_id, a whole-number quantity or null, nothing else) is decoded here;
// any other is left to decodeJSON, so that what it accepts and the message
// of what it refuses are the strict decoder's (FuzzDecodeOrder compares).
// The sku_id of a sale in cat (nil: none) is the catalog's string, not a
// copy.
func decodeOrder(body []byte, cat *purchase.Catalog) (orderInput, error) {
	if in, ok := decodeOrderFast(body, cat); ok {
		return in, nil
	}
	var req orderRequest
	if err := decodeJSON(body, &req); err != nil {
		return orderInput{}, err
	}
	in := orderInput{SKU: req.SKU, Quantity: 1}
	if req.Quantity != nil {
		in.Quantity = *req.Quantity
	}
	return in, nil
}

func decodeOrderFast(b []byte, cat *purchase.Catalog) (orderInput, bool) {
	in := orderInput{Quantity: 1}
	var sawSKU, sawQty bool
	l := lexer{b: b}
	l.space()
	if !l.eat('{') {
		return in, false
	}
	l.space()
	if l.eat('}') {
		return in, l.end()
	}
	for {
		l.space()
		switch {
		case !sawSKU && l.literal(`"sku_id"`):
			sawSKU = true
			if l.space(); !l.eat(':') {
				return in, false
			}
			if l.space(); l.null() {
				break
			}
			if !l.eat('"') {
				return in, false
			}
			start := l.i
			for l.i < len(b) && b[l.i] >= 0x20 && b[l.i] < 0x7f && b[l.i] != '"' && b[l.i] != '\\' {
				l.i++
			}
			if !l.eat('"') {
				return in, false
			}
			raw := b[start : l.i-1]
			var known bool
			if cat != nil {
				in.SKU, known = cat.ID(raw)
			}
			if !known {
				in.SKU = string(raw)
			}
		case !sawQty && l.literal(`"quantity"`):
			sawQty = true
			if l.space(); !l.eat(':') {
				return in, false
			}
			if l.space(); l.null() {
				break
			}
			q, ok := l.wholeNumber()
			if !ok {
				return in, false
			}
			in.Quantity = q
		default:
			return in, false
		}
		l.space()
		if l.eat('}') {
			return in, l.end()
		}
		if !l.eat(',') {
			return in, false
		}
	}
}

// wholeNumber consumes a JSON number with no fraction or exponent and at
// most 18 digits (so it fits an int64).
func (l *lexer) wholeNumber() (int64, bool) {
	b, i := l.b, l.i
	neg := i < len(b) && b[i] == '-'
	if neg {
		i++
	}
	start := i
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	digits := b[start:i]
	if len(digits) == 0 || len(digits) > 18 || digits[0] == '0' && len(digits) > 1 {
		return 0, false
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		return 0, false
	}
	var n int64
	for _, c := range digits {
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	l.i = i
	return n, true
}

// lexer walks a JSON document for decodeOrderFast.
type lexer struct {
	b []byte
	i int
}

func (l *lexer) space() {
	for l.i < len(l.b) {
		switch l.b[l.i] {
		case ' ', '\t', '\n', '\r':
			l.i++
		default:
			return
		}
	}
}

func (l *lexer) eat(c byte) bool {
	if l.i < len(l.b) && l.b[l.i] == c {
		l.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (l *lexer) end() bool {
	l.space()
	return l.i == len(l.b)
}

func (l *lexer) literal(s string) bool {
	if len(l.b)-l.i >= len(s) && string(l.b[l.i:l.i+len(s)]) == s {
		l.i += len(s)
		return true
	}
	return false
}

// null consumes a null literal if one is next.
func (l *lexer) null() bool { return l.literal("null") }

// decodeJSON is the strict decoder behind decode (fuzzed).
func decodeJSON(body []byte, v any) error {
	if err := checkDepth(body); err != nil {
		return err
	}
	if err := checkDuplicateKeys(body); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &publicError{base: fmt.Errorf("%w: malformed JSON: %w", sale.ErrInvalid, err), msg: jsonMessage(err)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid("trailing data after the JSON object")
	}
	return nil
}

// jsonMessage says what is wrong with a body encoding/json refused, in the
// client's terms: JSON field names and JSON types, never Go's.
func jsonMessage(err error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	var timeErr *time.ParseError
	switch {
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return "the body must be a JSON object"
		}
		return fmt.Sprintf("field %q must be %s", typeErr.Field, jsonType(typeErr.Type))
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("malformed JSON at byte %d", syntaxErr.Offset)
	case errors.As(err, &timeErr), strings.HasPrefix(err.Error(), "Time.UnmarshalJSON"): // the latter: not a string
		return "times must be RFC 3339 strings, e.g. 2026-12-01T12:00:00Z"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the body is empty or ends early"
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return "unknown field " + name
	}
	return "malformed JSON"
}

// jsonType names the JSON type that decodes into t.
func jsonType(t reflect.Type) string {
	if t == reflect.TypeFor[time.Time]() {
		return "an RFC 3339 time string"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number in range"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative whole number in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonType(t.Elem())
	}
	return "of another type"
}

func checkDepth(b []byte) error {
	depth := 0
	inStr, esc := false, false
	for _, c := range b {
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			depth++
			if depth > maxDepth {
				return invalid("JSON nested deeper than %d", maxDepth)
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return nil
}

// checkDuplicateKeys refuses an object that names a key twice (anywhere in
// the document). Parsers disagree on which one wins, so a proxy, a log or a
// WAF could see another request than the one decoded here. Keys are
// compared as encoding/json matches them to fields: case-insensitively.
// Malformed input passes: the decoder reports it.
func checkDuplicateKeys(b []byte) error {
	type frame struct {
		keys    map[string]struct{} // nil for an array
		wantKey bool
	}
	var stack []frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].wantKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				stack = append(stack, frame{keys: map[string]struct{}{}, wantKey: true})
			case '[':
				stack = append(stack, frame{})
			default:
				if len(stack) == 0 {
					return nil
				}
				stack = stack[:len(stack)-1]
				valueDone()
			}
		case string:
			if n := len(stack); n > 0 && stack[n-1].keys != nil && stack[n-1].wantKey {
				k := strings.ToLower(strings.ToUpper(t))
				if _, dup := stack[n-1].keys[k]; dup {
					return invalid("key %q appears more than once", t)
				}
				stack[n-1].keys[k] = struct{}{}
				stack[n-1].wantKey = false
				continue
			}
			valueDone()
		default:
			valueDone()
		}
	}
}
