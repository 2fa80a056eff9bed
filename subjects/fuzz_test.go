package subjects

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// Fuzz targets of the request decoders and the ID and subject parsers.
// Each checks a property, not only the absence of a panic: a refusal is an
// *Error with a code the decoder may give; an accepted body obeys the
// strict rules (checked by strictOracle, with encoding/json, not JSON v2)
// and what it decoded to reads back the same from a body built from it.
// .ci/fuzz runs every target for a few seconds.

// strictSeeds are bodies every decoder's corpus starts from: the attacks
// of issue 8 and the shapes around them.
var strictSeeds = []string{
	``, `{}`, `  {} `, `[]`, `null`, `{`, `{} {}`, `{"a":1}x`,
	`{"duration_ms":3600000,"Duration_MS":5}`, `{"duration_ms":1,"duration_ms":2}`, `{"a":{"b":1,"b":2}}`,
	"{\"summary\":\"\xff\"}", "{\"\xfe\":1}", `{"summary":"\udc00"}`, `{"summary":"\ud83d\ude00"}`, `{"x\u0041":1}`,
}

// codes of the decoding rules themselves, which every decoder may give.
var decodeCodes = []string{CodeInvalidJSON, CodeInvalidRequest}

// rejected checks a refusal: an *Error with one of codes and a message.
func rejected(t *testing.T, body []byte, err error, codes ...string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Message == "" || !slices.Contains(codes, e.Code) {
		t.Fatalf("%q refused with %#v (%v), want one of %v", body, e, err, codes)
	}
}

// strictOracle checks an accepted body with encoding/json, independently of
// the JSON v2 decoder under test: valid UTF-8, empty or one JSON object, no
// key twice in any object, and every top-level key one of keys, exactly.
func strictOracle(t *testing.T, body []byte, keys ...string) {
	t.Helper()
	if !utf8.Valid(body) {
		t.Fatalf("accepted invalid UTF-8: %q", body)
	}
	if len(bytes.Trim(body, jsonSpace)) == 0 {
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

// encodeBody is a request body built from decoded values.
func encodeBody(t *testing.T, v any) []byte {
	t.Helper()
	b, err := EncodeJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fuzzRequest fuzzes a request decoder: a refusal must carry one of codes;
// an accepted body must pass strictOracle with keys, then check on what it
// decoded to.
func fuzzRequest[T any](f *testing.F, decode func([]byte) (T, error), keys, codes []string, check func(t *testing.T, body []byte, v T)) {
	f.Fuzz(func(t *testing.T, body []byte) {
		v, err := decode(body)
		if err != nil {
			rejected(t, body, err, codes...)
			return
		}
		strictOracle(t, body, keys...)
		check(t, body, v)
	})
}

func addSeeds(f *testing.F, bodies ...string) {
	for _, s := range append(slices.Clone(strictSeeds), bodies...) {
		f.Add([]byte(s))
	}
}

// fuzzStrict is DecodeStrict's own target type: strings, a boolean and a
// raw value, the kinds request fields have.
type fuzzStrict struct {
	S    string          `json:"s"`
	Opt  string          `json:"opt,omitempty"`
	Flag bool            `json:"flag"`
	Raw  json.RawMessage `json:"raw,omitempty"`
}

func FuzzDecodeStrict(f *testing.F) {
	addSeeds(f, `{"s":"x","flag":true,"raw":[1,{"a":"b"}]}`, `{"S":"x"}`, `{"s":5}`, `{"raw":{"a":1,"a":1}}`, `{"s":"\ufffd"}`)
	decode := func(body []byte) (v fuzzStrict, err error) { return v, DecodeStrict(body, &v) }
	fuzzRequest(f, decode, []string{"s", "opt", "flag", "raw"}, decodeCodes, func(t *testing.T, body []byte, v fuzzStrict) {
		if !utf8.ValidString(v.S) || !utf8.ValidString(v.Opt) {
			t.Fatalf("%q decoded to invalid UTF-8 %+v", body, v)
		}
		if v.Raw != nil {
			c, err := compactStrict(v.Raw)
			if err != nil {
				t.Fatalf("%q: raw value %q does not read back: %v", body, v.Raw, err)
			}
			v.Raw = c
		}
		if back, err := decode(encodeBody(t, v)); err != nil || !reflect.DeepEqual(back, v) {
			t.Fatalf("%q decoded to %+v, which reads back as %+v (%v)", body, v, back, err)
		}
	})
}

func FuzzDecodeCreateTimer(f *testing.F) {
	addSeeds(f, `{"duration_ms":1000}`, `{"duration_ms":1,"interval_ms":2,"summary":"s","authority_class":"op"}`,
		`{"duration_ms":1.5}`, `{"duration_ms":"5"}`, `{"duration_ms":1e400}`, `{"duration_ms":3153600000000}`)
	keys := []string{"duration_ms", "interval_ms", "summary", "authority_class"}
	fuzzRequest(f, decodeCreateTimer, keys, decodeCodes, func(t *testing.T, body []byte, spec TimerSpec) {
		maxD := time.Duration(MaxTimerMs) * time.Millisecond
		if spec.Duration <= 0 || spec.Duration > maxD || spec.Interval < 0 || spec.Interval > maxD ||
			spec.Duration%time.Millisecond != 0 || spec.Interval%time.Millisecond != 0 ||
			utf8.RuneCountInString(spec.Summary) > MaxSummaryLen || len(spec.AuthorityClass) > MaxIDLen {
			t.Fatalf("%q accepted as %+v", body, spec)
		}
		req := map[string]any{"duration_ms": spec.Duration.Milliseconds(), "summary": spec.Summary, "authority_class": spec.AuthorityClass}
		if spec.Interval > 0 {
			req["interval_ms"] = spec.Interval.Milliseconds()
		}
		if back, err := decodeCreateTimer(encodeBody(t, req)); err != nil || back != spec {
			t.Fatalf("%q accepted as %+v, which reads back as %+v (%v)", body, spec, back, err)
		}
	})
}

func FuzzDecodeListTimers(f *testing.F) {
	addSeeds(f, `{"limit":5}`, `{"limit":0}`, `{"limit":1001}`, `{"limit":"5"}`, `{"limit":null}`)
	fuzzRequest(f, DecodeListTimers, []string{"limit", "cursor"}, decodeCodes, func(t *testing.T, body []byte, page ListPage) {
		if page.Limit < 1 || page.Limit > MaxListLimit {
			t.Fatalf("%q accepted with limit %d", body, page.Limit)
		}
		back, err := DecodeListTimers(encodeBody(t, map[string]any{"limit": page.Limit, "cursor": EncodeCursor(ActionTimerList, page.From...)}))
		if err != nil || back.Limit != page.Limit || !slices.Equal(back.From, page.From) && len(page.From) > 0 && !page.From[0].End() {
			t.Fatalf("%+v reads back as %+v (%v)", page, back, err)
		}
	})
}

// fuzzRef fuzzes a decoder of a body naming one ID under key.
func fuzzRef(f *testing.F, key string, decode func([]byte) (string, error)) {
	addSeeds(f, `{"`+key+`":"x_1"}`, `{"`+key+`":"a.b"}`, `{"`+key+`":""}`, `{"`+key+`":5}`)
	codes := []string{CodeInvalidJSON, CodeInvalidRequest, CodeInvalidID}
	fuzzRequest(f, decode, []string{key}, codes, func(t *testing.T, body []byte, id string) {
		if !idPattern.MatchString(id) {
			t.Fatalf("%q accepted with %s %q", body, key, id)
		}
		if back, err := decode(encodeBody(t, map[string]string{key: id})); err != nil || back != id {
			t.Fatalf("%s %q reads back as %q (%v)", key, id, back, err)
		}
	})
}

func FuzzDecodeTimerRef(f *testing.F)   { fuzzRef(f, "timer_id", DecodeTimerRef) }
func FuzzDecodeWaitRef(f *testing.F)    { fuzzRef(f, "wait_id", DecodeWaitRef) }
func FuzzDecodeTriggerRef(f *testing.F) { fuzzRef(f, "external_trigger_id", DecodeTriggerRef) }

func FuzzDecodeIntervention(f *testing.F) {
	addSeeds(f, `{"action":"message","text":"stop that"}`, `{"action":"pause"}`, `{"action":"Pause"}`, `{"action":"message","text":" "}`)
	fuzzRequest(f, DecodeIntervention, []string{"text", "action"}, decodeCodes, func(t *testing.T, body []byte, req *InterventionRequest) {
		if !slices.Contains(InterventionActions(), req.Action) || (req.Action == ActionMessage && strings.TrimSpace(req.Text) == "") {
			t.Fatalf("%q accepted as %+v", body, req)
		}
		if back, err := DecodeIntervention(encodeBody(t, req)); err != nil || *back != *req {
			t.Fatalf("%+v reads back as %+v (%v)", req, back, err)
		}
	})
}

// FuzzDecodeNoFields: lifecycle.start, lifecycle.stop and trigger.list
// take nothing but an empty body or {}; strictOracle without keys checks it.
func FuzzDecodeNoFields(f *testing.F) {
	addSeeds(f, `{"force":true}`, "\t{ }\n")
	decode := func(body []byte) (struct{}, error) { return struct{}{}, DecodeNoFields(body) }
	fuzzRequest(f, decode, nil, decodeCodes, func(*testing.T, []byte, struct{}) {})
}

func FuzzDecodeCreateTrigger(f *testing.F) {
	addSeeds(f, `{"delivery_mode":"enqueue_message","label":"github"}`, `{"delivery_mode":"wake"}`, `{"label":5}`)
	decode := func(body []byte) (CreateTriggerRequest, error) {
		mode, label, err := DecodeCreateTrigger(body)
		return CreateTriggerRequest{Mode: string(mode), Label: label}, err
	}
	fuzzRequest(f, decode, []string{"delivery_mode", "label"}, decodeCodes, func(t *testing.T, body []byte, req CreateTriggerRequest) {
		if !slices.Contains(DeliveryModes(), DeliveryMode(req.Mode)) || len(req.Label) > maxLabel || !utf8.ValidString(req.Label) {
			t.Fatalf("%q accepted as %+v", body, req)
		}
		if back, err := decode(encodeBody(t, req)); err != nil || back != req {
			t.Fatalf("%+v reads back as %+v (%v)", req, back, err)
		}
	})
}

func FuzzDecodeResetTrigger(f *testing.F) {
	addSeeds(f, `{"delivery_mode":"wake_hint"}`, `{"delivery_mode":""}`, `{"delivery_mode":"Wake_Hint"}`)
	fuzzRequest(f, DecodeResetTrigger, []string{"delivery_mode"}, decodeCodes, func(t *testing.T, body []byte, mode DeliveryMode) {
		if !slices.Contains(DeliveryModes(), mode) {
			t.Fatalf("%q accepted as %q", body, mode)
		}
		if back, err := DecodeResetTrigger(encodeBody(t, ResetTriggerRequest{Mode: string(mode)})); err != nil || back != mode {
			t.Fatalf("%q reads back as %q (%v)", mode, back, err)
		}
	})
}

// idPattern is the ID rule of the contract, written independently of
// ValidateID: 1-64 characters of [A-Za-z0-9_-].
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// FuzzIDs checks ValidateID and the subject and key parsers against the
// contract's rules: what is accepted is a valid ID that builds the input
// back; what is refused is an invalid_id error.
func FuzzIDs(f *testing.F) {
	for _, s := range []string{
		"demo", "agent.demo.timer.create", "agent.demo", "agent.*.timer.create", "agent..x", "agent.a b.x",
		"intervention.apply.demo", "intervention.apply.a.b", "demo.tmr_1", "a.b.c", ".x", "x.", "",
		strings.Repeat("x", 64), strings.Repeat("x", 65), "é", "a\x00", "agent.\xff.x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := ValidateID("id", s); (err == nil) != idPattern.MatchString(s) {
			t.Fatalf("ValidateID(%q) = %v", s, err)
		} else if err != nil {
			rejected(t, []byte(s), err, CodeInvalidID)
		}

		if id, err := ParseAgent(s); err != nil {
			rejected(t, []byte(s), err, CodeInvalidID)
			// Refused: then no valid ID starts the subject.
			if rest, ok := strings.CutPrefix(s, "agent."); ok {
				if id, _, _ := strings.Cut(rest, "."); idPattern.MatchString(id) {
					t.Fatalf("ParseAgent(%q) refused agent %q: %v", s, id, err)
				}
			}
		} else if !idPattern.MatchString(id) || (s != "agent."+id && !strings.HasPrefix(s, Agent(id, ""))) {
			t.Fatalf("ParseAgent(%q) = %q", s, id)
		}

		if id, err := ParseInterventionApply(s); err != nil {
			rejected(t, []byte(s), err, CodeInvalidID)
			if rest, ok := strings.CutPrefix(s, interventionApplyPrefix); ok && idPattern.MatchString(rest) {
				t.Fatalf("ParseInterventionApply(%q) refused %q: %v", s, rest, err)
			}
		} else if !idPattern.MatchString(id) || InterventionApply(id) != s {
			t.Fatalf("ParseInterventionApply(%q) = %q", s, id)
		}

		agent, id, ok := ParseRecordKey(s)
		if want := strings.Count(s, ".") == 1 && !strings.HasPrefix(s, ".") && !strings.HasSuffix(s, "."); ok != want {
			t.Fatalf("ParseRecordKey(%q) ok = %v, want %v", s, ok, want)
		}
		if ok && (TimerKey(agent, id) != s || WaitKey(agent, id) != s) {
			t.Fatalf("ParseRecordKey(%q) = %q, %q", s, agent, id)
		}
	})
}

// decodeCreateTimer decodes without operator limits: the fuzzed property
// is the decoding.
func decodeCreateTimer(b []byte) (TimerSpec, error) { return DecodeCreateTimer(b, TimerLimits{}) }
