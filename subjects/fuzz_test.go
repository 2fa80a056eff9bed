package subjects_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/subjects/subjectstest"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// Fuzz targets of the request decoders and the ID and subject parsers.
// Each checks a property, not only the absence of a panic: a refusal is an
// *Error with a code the decoder may give; an accepted body obeys the
// strict rules (checked by subjectstest.StrictOracle, with encoding/json, not JSON v2)
// and what it decoded to reads back the same from a body built from it.
// .ci/fuzz runs every target for a few seconds.

// fuzzStrict is DecodeStrict's own target type: strings, a boolean and a
// raw value, the kinds request fields have.
type fuzzStrict struct {
	S    string          `json:"s"`
	Opt  string          `json:"opt,omitempty"`
	Flag bool            `json:"flag"`
	Raw  json.RawMessage `json:"raw,omitempty"`
}

func FuzzDecodeStrict(f *testing.F) {
	subjectstest.AddSeeds(f, `{"s":"x","flag":true,"raw":[1,{"a":"b"}]}`, `{"S":"x"}`, `{"s":5}`, `{"raw":{"a":1,"a":1}}`, `{"s":"\ufffd"}`)
	decode := func(body []byte) (v fuzzStrict, err error) { return v, subjects.DecodeStrict(body, &v) }
	subjectstest.Request(f, decode, []string{"s", "opt", "flag", "raw"}, subjectstest.DecodeCodes, func(t *testing.T, body []byte, v fuzzStrict) {
		if !utf8.ValidString(v.S) || !utf8.ValidString(v.Opt) {
			t.Fatalf("%q decoded to invalid UTF-8 %+v", body, v)
		}
		if v.Raw != nil {
			c, err := subjects.CompactStrict(v.Raw)
			if err != nil {
				t.Fatalf("%q: raw value %q does not read back: %v", body, v.Raw, err)
			}
			v.Raw = c
		}
		if back, err := decode(subjectstest.EncodeBody(t, v)); err != nil || !reflect.DeepEqual(back, v) {
			t.Fatalf("%q decoded to %+v, which reads back as %+v (%v)", body, v, back, err)
		}
	})
}

func FuzzDecodeCreateTimer(f *testing.F) {
	subjectstest.AddSeeds(f, `{"duration_ms":1000}`, `{"duration_ms":1,"interval_ms":2,"summary":"s","authority_class":"op"}`,
		`{"duration_ms":1.5}`, `{"duration_ms":"5"}`, `{"duration_ms":1e400}`, `{"duration_ms":3153600000000}`)
	keys := []string{"duration_ms", "interval_ms", "summary", "authority_class"}
	subjectstest.Request(f, decodeCreateTimer, keys, subjectstest.DecodeCodes, func(t *testing.T, body []byte, spec timers.TimerSpec) {
		maxD := time.Duration(timers.MaxTimerMs) * time.Millisecond
		if spec.Duration <= 0 || spec.Duration > maxD || spec.Interval < 0 || spec.Interval > maxD ||
			spec.Duration%time.Millisecond != 0 || spec.Interval%time.Millisecond != 0 ||
			utf8.RuneCountInString(spec.Summary) > timers.MaxSummaryLen || len(spec.AuthorityClass) > subjects.MaxIDLen {
			t.Fatalf("%q accepted as %+v", body, spec)
		}
		req := map[string]any{"duration_ms": spec.Duration.Milliseconds(), "summary": spec.Summary, "authority_class": spec.AuthorityClass}
		if spec.Interval > 0 {
			req["interval_ms"] = spec.Interval.Milliseconds()
		}
		if back, err := decodeCreateTimer(subjectstest.EncodeBody(t, req)); err != nil || back != spec {
			t.Fatalf("%q accepted as %+v, which reads back as %+v (%v)", body, spec, back, err)
		}
	})
}

func FuzzDecodeListTimers(f *testing.F) {
	subjectstest.AddSeeds(f, `{"limit":5}`, `{"limit":0}`, `{"limit":1001}`, `{"limit":"5"}`, `{"limit":null}`)
	subjectstest.Request(f, timers.DecodeListTimers, []string{"limit", "cursor"}, subjectstest.DecodeCodes, func(t *testing.T, body []byte, page subjects.ListPage) {
		if page.Limit < 1 || page.Limit > subjects.MaxListLimit {
			t.Fatalf("%q accepted with limit %d", body, page.Limit)
		}
		back, err := timers.DecodeListTimers(subjectstest.EncodeBody(t, map[string]any{"limit": page.Limit, "cursor": subjects.EncodeCursor(subjects.ActionTimerList, page.From...)}))
		if err != nil || back.Limit != page.Limit || !slices.Equal(back.From, page.From) && len(page.From) > 0 && !page.From[0].End() {
			t.Fatalf("%+v reads back as %+v (%v)", page, back, err)
		}
	})
}

func FuzzDecodeTimerRef(f *testing.F) { subjectstest.Ref(f, "timer_id", timers.DecodeTimerRef) }
func FuzzDecodeWaitRef(f *testing.F)  { subjectstest.Ref(f, "wait_id", waits.DecodeWaitRef) }
func FuzzDecodeTriggerRef(f *testing.F) {
	subjectstest.Ref(f, "external_trigger_id", callbacks.DecodeTriggerRef)
}

func FuzzDecodeIntervention(f *testing.F) {
	subjectstest.AddSeeds(f, `{"action":"message","text":"stop that"}`, `{"action":"pause"}`, `{"action":"Pause"}`, `{"action":"message","text":" "}`)
	subjectstest.Request(f, interventions.DecodeIntervention, []string{"text", "action"}, subjectstest.DecodeCodes, func(t *testing.T, body []byte, req *interventions.InterventionRequest) {
		if !slices.Contains(interventions.InterventionActions(), req.Action) || (req.Action == interventions.ActionMessage && strings.TrimSpace(req.Text) == "") {
			t.Fatalf("%q accepted as %+v", body, req)
		}
		if back, err := interventions.DecodeIntervention(subjectstest.EncodeBody(t, req)); err != nil || *back != *req {
			t.Fatalf("%+v reads back as %+v (%v)", req, back, err)
		}
	})
}

// FuzzDecodeNoFields: lifecycle.start, lifecycle.stop and trigger.list
// take nothing but an empty body or {}; subjectstest.StrictOracle without keys checks it.
func FuzzDecodeNoFields(f *testing.F) {
	subjectstest.AddSeeds(f, `{"force":true}`, "\t{ }\n")
	decode := func(body []byte) (struct{}, error) { return struct{}{}, subjects.DecodeNoFields(body) }
	subjectstest.Request(f, decode, nil, subjectstest.DecodeCodes, func(*testing.T, []byte, struct{}) {})
}

func FuzzDecodeCreateTrigger(f *testing.F) {
	subjectstest.AddSeeds(f, `{"delivery_mode":"enqueue_message","label":"github"}`, `{"delivery_mode":"wake"}`, `{"label":5}`)
	decode := func(body []byte) (callbacks.CreateTriggerRequest, error) {
		mode, label, err := callbacks.DecodeCreateTrigger(body)
		return callbacks.CreateTriggerRequest{Mode: string(mode), Label: label}, err
	}
	subjectstest.Request(f, decode, []string{"delivery_mode", "label"}, subjectstest.DecodeCodes, func(t *testing.T, body []byte, req callbacks.CreateTriggerRequest) {
		if !slices.Contains(callbacks.DeliveryModes(), callbacks.DeliveryMode(req.Mode)) || len(req.Label) > callbacks.MaxLabelLen || !utf8.ValidString(req.Label) {
			t.Fatalf("%q accepted as %+v", body, req)
		}
		if back, err := decode(subjectstest.EncodeBody(t, req)); err != nil || back != req {
			t.Fatalf("%+v reads back as %+v (%v)", req, back, err)
		}
	})
}

func FuzzDecodeResetTrigger(f *testing.F) {
	subjectstest.AddSeeds(f, `{"delivery_mode":"wake_hint"}`, `{"delivery_mode":""}`, `{"delivery_mode":"Wake_Hint"}`)
	subjectstest.Request(f, callbacks.DecodeResetTrigger, []string{"delivery_mode"}, subjectstest.DecodeCodes, func(t *testing.T, body []byte, mode callbacks.DeliveryMode) {
		if !slices.Contains(callbacks.DeliveryModes(), mode) {
			t.Fatalf("%q accepted as %q", body, mode)
		}
		if back, err := callbacks.DecodeResetTrigger(subjectstest.EncodeBody(t, callbacks.ResetTriggerRequest{Mode: string(mode)})); err != nil || back != mode {
			t.Fatalf("%q reads back as %q (%v)", mode, back, err)
		}
	})
}

// subjectstest.IDPattern is the ID rule of the contract, written independently of
// ValidateID: 1-64 characters of [A-Za-z0-9_-].

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
		if err := subjects.ValidateID("id", s); (err == nil) != subjectstest.IDPattern.MatchString(s) {
			t.Fatalf("ValidateID(%q) = %v", s, err)
		} else if err != nil {
			subjectstest.Rejected(t, []byte(s), err, subjects.CodeInvalidID)
		}

		if id, err := subjects.ParseAgent(s); err != nil {
			subjectstest.Rejected(t, []byte(s), err, subjects.CodeInvalidID)
			// Refused: then no valid ID starts the subject.
			if rest, ok := strings.CutPrefix(s, "agent."); ok {
				if id, _, _ := strings.Cut(rest, "."); subjectstest.IDPattern.MatchString(id) {
					t.Fatalf("ParseAgent(%q) refused agent %q: %v", s, id, err)
				}
			}
		} else if !subjectstest.IDPattern.MatchString(id) || (s != "agent."+id && !strings.HasPrefix(s, subjects.Agent(id, ""))) {
			t.Fatalf("ParseAgent(%q) = %q", s, id)
		}

		if id, err := subjects.ParseInterventionApply(s); err != nil {
			subjectstest.Rejected(t, []byte(s), err, subjects.CodeInvalidID)
			if rest, ok := strings.CutPrefix(s, subjects.InterventionApply("")); ok && subjectstest.IDPattern.MatchString(rest) {
				t.Fatalf("ParseInterventionApply(%q) refused %q: %v", s, rest, err)
			}
		} else if !subjectstest.IDPattern.MatchString(id) || subjects.InterventionApply(id) != s {
			t.Fatalf("ParseInterventionApply(%q) = %q", s, id)
		}

		agent, id, ok := subjects.ParseRecordKey(s)
		if want := strings.Count(s, ".") == 1 && !strings.HasPrefix(s, ".") && !strings.HasSuffix(s, "."); ok != want {
			t.Fatalf("ParseRecordKey(%q) ok = %v, want %v", s, ok, want)
		}
		if ok && (subjects.TimerKey(agent, id) != s || waits.WaitKey(agent, id) != s) {
			t.Fatalf("ParseRecordKey(%q) = %q, %q", s, agent, id)
		}
	})
}

// decodeCreateTimer decodes without operator limits: the fuzzed property
// is the decoding.
func decodeCreateTimer(b []byte) (timers.TimerSpec, error) {
	return timers.DecodeCreateTimer(b, timers.TimerLimits{})
}
