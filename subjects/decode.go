package subjects

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// This file is the one place request bodies are read. JSON v2 (the
// go-json-experiment module) does the strict part: keys match exactly,
// duplicate keys and invalid UTF-8 (lone surrogate escapes included) are
// syntax errors, and unknown fields are refused. encoding/json would match
// "Duration_MS" to duration_ms, let the last of two duplicates win and
// store U+FFFD for bad bytes: each a way to smuggle a value past a reader
// that sees the body differently.

// jsonSpace is the whitespace JSON allows around a value; bytes.TrimSpace
// would also take Unicode spaces (U+00A0...) that no JSON parser accepts.
const jsonSpace = " \t\r\n"

// DecodeStrict decodes one JSON object into v, which must point to a
// struct: exact, case-sensitive keys, no duplicate keys, valid UTF-8, no
// unknown fields, no data after the object. An empty body decodes as {}
// so that requests whose fields are all optional may be sent without one.
func DecodeStrict(data []byte, v any) error {
	if len(bytes.Trim(data, jsonSpace)) == 0 {
		data = []byte("{}")
	}
	if err := checkUTF8(data); err != nil {
		return err
	}
	if bytes.Trim(data, jsonSpace)[0] != '{' {
		return &Error{Code: CodeInvalidJSON, Message: "request body must be a JSON object"}
	}
	if err := checkSyntax(data); err != nil {
		return err
	}
	if err := jsonv2.Unmarshal(data, v, jsonv2.RejectUnknownMembers(true)); err != nil {
		return semanticError(err)
	}
	return nil
}

// CompactStrict checks that data is one JSON value of any kind under the
// rules of DecodeStrict and returns it compacted, escapes as sent.
func CompactStrict(data []byte) ([]byte, error) {
	if err := checkUTF8(data); err != nil {
		return nil, err
	}
	if err := checkSyntax(data); err != nil {
		return nil, err
	}
	out := jsontext.Value(bytes.Clone(data))
	if err := out.Compact(); err != nil {
		return nil, fmt.Errorf("compact a valid JSON value: %w", err) // not expected: data was just read as valid
	}
	return out, nil
}

// checkUTF8 refuses a body that is not UTF-8 anywhere, keys included.
func checkUTF8(data []byte) error {
	if utf8.Valid(data) {
		return nil
	}
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n == 1 {
			return &Error{Code: CodeInvalidJSON, Message: fmt.Sprintf("invalid UTF-8: byte 0x%02x at offset %d", data[i], i)}
		}
		i += n
	}
	return nil // not reached: utf8.Valid said there is a bad byte
}

// checkSyntax checks that data holds exactly one JSON value, syntax only.
func checkSyntax(data []byte) error {
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	val, err := dec.ReadValue()
	if err != nil {
		return syntaxError(data, err)
	}
	if len(bytes.Trim(data[dec.InputOffset():], jsonSpace)) != 0 {
		what := "value"
		if val.Kind() == '{' {
			what = "object"
		}
		return &Error{Code: CodeInvalidJSON, Message: "malformed JSON: unexpected data after the " + what}
	}
	return nil
}

// syntaxError words a jsontext error; offsets count bytes of data.
func syntaxError(data []byte, err error) error {
	var se *jsontext.SyntacticError
	switch {
	case !errors.As(err, &se) || errors.Is(se.Err, io.ErrUnexpectedEOF): // io.EOF: no value at all
		return &Error{Code: CodeInvalidJSON, Message: "malformed JSON: unexpected EOF"}
	case errors.Is(se.Err, jsontext.ErrDuplicateName):
		msg := fmt.Sprintf("duplicate key %q", se.JSONPointer.LastToken())
		if parent := se.JSONPointer.Parent(); parent != "" {
			msg += " in " + fieldName(parent)
		}
		return &Error{Code: CodeInvalidJSON, Message: msg}
	}
	// A lone surrogate decodes to no character; jsontext's own text for it
	// quotes the rest of the body.
	if esc, ok := surrogateAt(data, se.ByteOffset); ok {
		return &Error{Code: CodeInvalidJSON, Message: fmt.Sprintf("invalid UTF-8: lone surrogate %s at offset %d", esc, se.ByteOffset)}
	}
	return &Error{Code: CodeInvalidJSON, Message: fmt.Sprintf("malformed JSON: %v (offset %d)", se.Err, se.ByteOffset)}
}

// surrogateAt returns the \uXXXX escape at off when it names a UTF-16
// surrogate.
func surrogateAt(data []byte, off int64) (string, bool) {
	if off < 0 || off > int64(len(data))-6 {
		return "", false
	}
	esc := data[off : off+6]
	if esc[0] != '\\' || esc[1] != 'u' {
		return "", false
	}
	n, err := strconv.ParseUint(string(esc[2:]), 16, 16)
	if err != nil || !utf16.IsSurrogate(rune(n)) {
		return "", false
	}
	return string(esc), true
}

// semanticError words a JSON v2 unmarshal error in encoding/json's terms
// ("unknown field", "<field> must be a JSON string, not number"), which
// callers and tests already rely on.
func semanticError(err error) error {
	var se *jsonv2.SemanticError
	if !errors.As(err, &se) {
		return &Error{Code: CodeInvalidJSON, Message: "malformed JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
	}
	field := fieldName(se.JSONPointer)
	switch {
	case errors.Is(se.Err, jsonv2.ErrUnknownName):
		msg := fmt.Sprintf("unknown field %q", se.JSONPointer.LastToken())
		if parent := se.JSONPointer.Parent(); parent != "" {
			msg += " in " + fieldName(parent)
		}
		return &Error{Code: CodeInvalidRequest, Message: msg}
	case se.Err == nil && se.GoType != nil && se.JSONKind != 0:
		return &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("%s must be a JSON %s, not %s", field, goTypeName(se.GoType), kindName(se.JSONKind))}
	default:
		msg := strings.TrimPrefix(se.Error(), "json: ")
		if field != "" {
			msg = field + ": " + msg
		}
		return &Error{Code: CodeInvalidRequest, Message: msg}
	}
}

// fieldName writes a JSON pointer as encoding/json named fields: a.b.0.
func fieldName(p jsontext.Pointer) string {
	var parts []string
	for tok := range p.Tokens() {
		parts = append(parts, tok)
	}
	return strings.Join(parts, ".")
}

func goTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Struct, reflect.Map:
		return "object"
	default:
		return "number"
	}
}

func kindName(k jsontext.Kind) string {
	switch k {
	case '"':
		return "string"
	case '0':
		return "number"
	case 't', 'f':
		return "boolean"
	case '{':
		return "object"
	case '[':
		return "array"
	default:
		return k.String() // null
	}
}

// PositiveInt parses a JSON number field that must be a positive integer no
// larger than max. raw is nil when the field was absent.
func PositiveInt(field string, raw json.RawMessage, max int64) (int64, error) {
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

// IsNull reports whether a raw member is absent or null.
func IsNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// Invalid is the invalid_request error with msg.
func Invalid(msg string) *Error { return &Error{Code: CodeInvalidRequest, Message: msg} }

// DecodeNoFields decodes the body of a request that takes none
// (lifecycle.start, lifecycle.stop, trigger.list): empty or {}.
func DecodeNoFields(data []byte) error { return DecodeStrict(data, &struct{}{}) }

// WithField adds field, a string, to an HTTP request's body whose route
// names it in its path: a body that is not a JSON object is left as it is
// for the decoder to refuse, and one naming field itself is refused as a
// duplicate key.
func WithField(body []byte, field, value string) []byte {
	name, _ := json.Marshal(field)
	v, _ := json.Marshal(value)
	head := append(append(append([]byte{'{'}, name...), ':'), v...)
	rest := bytes.TrimLeft(body, jsonSpace)
	switch {
	case len(rest) == 0:
		return append(head, '}')
	case rest[0] != '{':
		return body
	case len(bytes.TrimLeft(rest[1:], jsonSpace)) > 0 && bytes.TrimLeft(rest[1:], jsonSpace)[0] == '}':
		return append(head, rest[1:]...)
	}
	return append(append(head, ','), rest[1:]...)
}
