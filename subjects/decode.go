package subjects

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// DecodeStrict decodes one JSON object into v, rejecting unknown fields and
// trailing data. An empty body decodes as {} so that requests whose fields
// are all optional may be sent without one.
func DecodeStrict(data []byte, v any) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		data = []byte("{}")
	}
	if data[0] != '{' {
		return &Error{Code: CodeInvalidJSON, Message: "request body must be a JSON object"}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &Error{Code: CodeInvalidJSON, Message: "malformed JSON: unexpected data after the object"}
	}
	return nil
}

func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typeErr):
		return &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("%s must be a JSON %s, not %s", typeErr.Field, typeName(typeErr.Type.Kind().String()), typeErr.Value)}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return &Error{Code: CodeInvalidRequest, Message: strings.TrimPrefix(err.Error(), "json: ")}
	default:
		return &Error{Code: CodeInvalidJSON, Message: "malformed JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
	}
}

func typeName(kind string) string {
	switch kind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "slice":
		return "array"
	case "struct", "map":
		return "object"
	default:
		return "number"
	}
}

// positiveInt parses a JSON number field that must be a positive integer no
// larger than max. raw is nil when the field was absent.
func positiveInt(field string, raw json.RawMessage, max int64) (int64, error) {
	s := string(bytes.TrimSpace(raw))
	if s == "" || s == "null" {
		return 0, &Error{Code: CodeInvalidRequest, Message: field + " is required"}
	}
	if s[0] != '-' && (s[0] < '0' || s[0] > '9') {
		return 0, &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("%s must be a positive integer, not %s", field, s)}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("%s is too large: at most %d", field, max)}
		}
		if f, ferr := strconv.ParseFloat(s, 64); (ferr == nil || errors.Is(ferr, strconv.ErrRange)) && f >= float64(max) {
			return 0, &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("%s is too large: at most %d", field, max)}
		}
		return 0, &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("%s must be a positive integer, not %s", field, s)}
	}
	if n <= 0 {
		return 0, &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("%s must be a positive integer, not %s", field, s)}
	}
	if n > max {
		return 0, &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("%s is too large: at most %d", field, max)}
	}
	return n, nil
}
