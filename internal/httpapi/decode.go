package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/flashsale/flashsale/internal/sale"
)

// maxBody bounds every request body; a larger one is 413 body_too_large.
const maxBody = 8 << 10

// maxDepth bounds JSON nesting; deeper documents are refused before decoding.
const maxDepth = 8

// decode reads a strict JSON object into v: Content-Type application/json,
// at most maxBody bytes, no unknown fields, no trailing data, bounded depth.
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
