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
	"time"

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
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || !slices.Contains(types, mt) {
		return nil, errMediaType
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, errTooLarge
		}
		return nil, &publicError{base: fmt.Errorf("%w: reading body: %w", sale.ErrInvalid, err), msg: "The request body could not be read."}
	}
	return body, nil
}

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
