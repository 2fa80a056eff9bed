// Package subjectstest holds the property checks every request decoder's
// fuzz target shares: a refusal is a *subjects.Error with a code the decoder
// may give; an accepted body obeys the strict rules (checked by StrictOracle
// with encoding/json, independently of the JSON v2 decoder under test) and
// reads back the same from a body built from what it decoded to.
package subjectstest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/chime-nats/chime/subjects"
)

// StrictSeeds are bodies every decoder's corpus starts from: the attacks
// of issue 8 and the shapes around them.
var StrictSeeds = []string{
	``, `{}`, `  {} `, `[]`, `null`, `{`, `{} {}`, `{"a":1}x`,
	`{"duration_ms":3600000,"Duration_MS":5}`, `{"duration_ms":1,"duration_ms":2}`, `{"a":{"b":1,"b":2}}`,
	"{\"summary\":\"\xff\"}", "{\"\xfe\":1}", `{"summary":"\udc00"}`, `{"summary":"\ud83d\ude00"}`, `{"x\u0041":1}`,
}

// codes of the decoding rules themselves, which every decoder may give.
var DecodeCodes = []string{subjects.CodeInvalidJSON, subjects.CodeInvalidRequest}

// Rejected checks a refusal: an *Error with one of codes and a message.
func Rejected(t *testing.T, body []byte, err error, codes ...string) {
	t.Helper()
	var e *subjects.Error
	if !errors.As(err, &e) || e.Message == "" || !slices.Contains(codes, e.Code) {
		t.Fatalf("%q refused with %#v (%v), want one of %v", body, e, err, codes)
	}
}

// StrictOracle checks an accepted body with encoding/json, independently of
// the JSON v2 decoder under test: valid UTF-8, empty or one JSON object, no
// key twice in any object, and every top-level key one of keys, exactly.
func StrictOracle(t *testing.T, body []byte, keys ...string) {
	t.Helper()
	if !utf8.Valid(body) {
		t.Fatalf("accepted invalid UTF-8: %q", body)
	}
	if len(bytes.Trim(body, " \t\r\n")) == 0 {
		return
	}
	type frame struct {
		object, wantKey bool
		seen            map[string]bool
	}
	var stack []*frame
	values := 0 // complete top-level values
	valueDone := func() {
		if n := len(stack); n == 0 {
			values++
		} else if stack[n-1].object {
			stack[n-1].wantKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for first := true; ; first = false {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil || values > 0 || (first && tok != json.Delim('{')) {
			t.Fatalf("accepted %q, which is not one JSON object: %v", body, err)
		}
		n := len(stack)
		if n > 0 && stack[n-1].object && stack[n-1].wantKey {
			if tok == json.Delim('}') {
				stack = stack[:n-1]
				valueDone()
				continue
			}
			key := tok.(string)
			if stack[n-1].seen[key] {
				t.Fatalf("accepted %q with key %q twice", body, key)
			}
			if n == 1 && !slices.Contains(keys, key) {
				t.Fatalf("accepted %q with key %q, not one of %v", body, key, keys)
			}
			stack[n-1].seen[key], stack[n-1].wantKey = true, false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, wantKey: true, seen: map[string]bool{}})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim(']'):
			stack = stack[:n-1]
			valueDone()
		default:
			if s, ok := tok.(string); ok && strings.ContainsRune(s, utf8.RuneError) && !mayHoldFFFD(body) {
				t.Fatalf("accepted %q: U+FFFD appeared that the body did not hold", body)
			}
			valueDone()
		}
	}
}

// mayHoldFFFD reports whether body spells U+FFFD itself, raw or escaped;
// otherwise a U+FFFD in a value was made up for a bad byte or surrogate.
func mayHoldFFFD(body []byte) bool {
	return bytes.Contains(body, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`))
}

// EncodeBody is a request body built from decoded values.
func EncodeBody(t *testing.T, v any) []byte {
	t.Helper()
	b, err := subjects.EncodeJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Request fuzzes a request decoder: a refusal must carry one of codes;
// an accepted body must pass StrictOracle with keys, then check on what it
// decoded to.
func Request[T any](f *testing.F, decode func([]byte) (T, error), keys, codes []string, check func(t *testing.T, body []byte, v T)) {
	f.Fuzz(func(t *testing.T, body []byte) {
		v, err := decode(body)
		if err != nil {
			Rejected(t, body, err, codes...)
			return
		}
		StrictOracle(t, body, keys...)
		check(t, body, v)
	})
}

// AddSeeds seeds f with StrictSeeds and bodies.
func AddSeeds(f *testing.F, bodies ...string) {
	for _, s := range append(slices.Clone(StrictSeeds), bodies...) {
		f.Add([]byte(s))
	}
}

// IDPattern is what the contract allows as an ID.
var IDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Ref fuzzes a decoder of a body naming one ID under key.
func Ref(f *testing.F, key string, decode func([]byte) (string, error)) {
	AddSeeds(f, `{"`+key+`":"x_1"}`, `{"`+key+`":"a.b"}`, `{"`+key+`":""}`, `{"`+key+`":5}`)
	codes := []string{subjects.CodeInvalidJSON, subjects.CodeInvalidRequest, subjects.CodeInvalidID}
	Request(f, decode, []string{key}, codes, func(t *testing.T, body []byte, id string) {
		if !IDPattern.MatchString(id) {
			t.Fatalf("%q accepted with %s %q", body, key, id)
		}
		if back, err := decode(EncodeBody(t, map[string]string{key: id})); err != nil || back != id {
			t.Fatalf("%s %q reads back as %q (%v)", key, id, back, err)
		}
	})
}
