package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

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
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	return decodeJSON(body, v)
}

// readBody checks the Content-Type and reads at most maxBody bytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return nil, errMediaType
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, errTooLarge
		}
		return nil, fmt.Errorf("%w: reading body: %v", sale.ErrInvalid, err)
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
		return fmt.Errorf("%w: malformed JSON: %v", sale.ErrInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: trailing data after the JSON object", sale.ErrInvalid)
	}
	return nil
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
				return fmt.Errorf("%w: JSON nested deeper than %d", sale.ErrInvalid, maxDepth)
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
					return fmt.Errorf("%w: key %q appears more than once", sale.ErrInvalid, t)
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
