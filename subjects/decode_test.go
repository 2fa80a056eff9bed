package subjects_test

import (
	"errors"
	"testing"
	"time"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waitfor"
	"github.com/chime-nats/chime/waits"
)

// strictCases are bodies every request decoder refuses the same way,
// whatever its fields: the rules live in DecodeStrict alone.
var strictCases = []struct {
	name, body, code, msg string
}{
	{"case-variant key", `{"Duration_MS":5}`, subjects.CodeInvalidRequest, `unknown field "Duration_MS"`},
	{"case-variant duplicate", `{"duration_ms":3600000,"Duration_MS":5}`, subjects.CodeInvalidRequest, `unknown field "Duration_MS"`},
	{"duplicate key", `{"duration_ms":3600000,"duration_ms":5}`, subjects.CodeInvalidJSON, `duplicate key "duration_ms"`},
	{"escaped duplicate", `{"duration_ms":1,"duration\u005fms":5}`, subjects.CodeInvalidJSON, `duplicate key "duration_ms"`},
	{"nested duplicate", `{"duration_ms":{"a":1,"a":2}}`, subjects.CodeInvalidJSON, `duplicate key "a" in duration_ms`},
	{"duplicate in an array", `{"duration_ms":[{"a":1},{"b":1,"b":2}]}`, subjects.CodeInvalidJSON, `duplicate key "b" in duration_ms.1`},
	{"invalid UTF-8 in a value", "{\"summary\":\"a\xffb\"}", subjects.CodeInvalidJSON, "invalid UTF-8: byte 0xff at offset 13"},
	{"invalid UTF-8 in a key", "{\"sum\xfemary\":\"x\"}", subjects.CodeInvalidJSON, "invalid UTF-8: byte 0xfe at offset 5"},
	{"encoded surrogate", "{\"summary\":\"\xed\xa0\x80\"}", subjects.CodeInvalidJSON, "invalid UTF-8: byte 0xed at offset 12"},
	{"overlong encoding", "{\"summary\":\"\xc0\xaf\"}", subjects.CodeInvalidJSON, "invalid UTF-8: byte 0xc0 at offset 12"},
	{"truncated sequence", "{\"summary\":\"\xe2\x82\"}", subjects.CodeInvalidJSON, "invalid UTF-8: byte 0xe2 at offset 12"},
	{"lone low surrogate", `{"summary":"\udc00"}`, subjects.CodeInvalidJSON, `invalid UTF-8: lone surrogate \udc00 at offset 12`},
	{"unpaired high surrogate", `{"summary":"\ud800x"}`, subjects.CodeInvalidJSON, `invalid UTF-8: lone surrogate \ud800 at offset 12`},
	{"reversed pair", `{"summary":"\udc00\ud800"}`, subjects.CodeInvalidJSON, `invalid UTF-8: lone surrogate \udc00 at offset 12`},
	{"lone surrogate in a key", `{"\ud800":1}`, subjects.CodeInvalidJSON, `invalid UTF-8: lone surrogate \ud800 at offset 2`},
	{"trailing object", `{"duration_ms":1} {}`, subjects.CodeInvalidJSON, "malformed JSON: unexpected data after the object"},
	{"trailing garbage", `{"duration_ms":1}x`, subjects.CodeInvalidJSON, "malformed JSON: unexpected data after the object"},
	{"array", `[1]`, subjects.CodeInvalidJSON, "request body must be a JSON object"},
	{"string", `"x"`, subjects.CodeInvalidJSON, "request body must be a JSON object"},
	{"null", `null`, subjects.CodeInvalidJSON, "request body must be a JSON object"},
	{"not JSON", `not json`, subjects.CodeInvalidJSON, "request body must be a JSON object"},
	{"non-JSON space", "\u00a0{}", subjects.CodeInvalidJSON, "request body must be a JSON object"},
	{"truncated", `{"duration_ms":`, subjects.CodeInvalidJSON, "malformed JSON: unexpected EOF"},
	{"trailing comma", `{"duration_ms":1,}`, subjects.CodeInvalidJSON, `malformed JSON: invalid character '}' at start of string (expecting '"') (offset 17)`},
}

// decoders are every request decoder of the package, as a caller sees it.
func decoders() map[string]func([]byte) error {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	return map[string]func([]byte) error{
		"timer.create":   func(b []byte) error { _, err := timers.DecodeCreateTimer(b, timers.TimerLimits{}); return err },
		"timer.list":     func(b []byte) error { _, err := timers.DecodeListTimers(b); return err },
		"timer.ref":      func(b []byte) error { _, err := timers.DecodeTimerRef(b); return err },
		"wait.request":   func(b []byte) error { _, err := waits.DecodeWaitRequest(b, now, ""); return err },
		"wait.cancel":    func(b []byte) error { _, err := waits.DecodeWaitRef(b); return err },
		"wait.for":       func(b []byte) error { _, err := waitfor.DecodeWaitFor(b); return err },
		"intervention":   func(b []byte) error { _, err := interventions.DecodeIntervention(b); return err },
		"notify":         func(b []byte) error { _, err := notifications.DecodeNotify(b, notifications.FromAgent); return err },
		"lifecycle":      subjects.DecodeNoFields,
		"trigger.create": func(b []byte) error { _, _, err := callbacks.DecodeCreateTrigger(b); return err },
		"trigger.reset":  func(b []byte) error { _, err := callbacks.DecodeResetTrigger(b); return err },
		"trigger.cancel": func(b []byte) error { _, err := callbacks.DecodeTriggerRef(b); return err },
	}
}

func TestStrictDecoding(t *testing.T) {
	for name, decode := range decoders() {
		for _, tc := range strictCases {
			err := decode([]byte(tc.body))
			var e *subjects.Error
			if !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.msg {
				// Only the timer create request has a duration_ms: for the
				// others a well-formed body names an unknown field first.
				if name != "timer.create" && tc.code == subjects.CodeInvalidRequest && errors.As(err, &e) && e.Code == tc.code {
					continue
				}
				t.Errorf("%s, %s %q: got %v, want %s: %s", name, tc.name, tc.body, err, tc.code, tc.msg)
			}
		}
	}
}

func TestStrictDecodingAccepts(t *testing.T) {
	var req timers.CreateTimerRequest
	body := `  {"duration_ms" : 5,` + "\t\r\n" + `"summary":"caf\u00e9 \ud83d\ude00 ✓","interval_ms":null}  `
	if err := subjects.DecodeStrict([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	if req.Summary != "café 😀 ✓" || string(req.DurationMs) != "5" || !subjects.IsNull(req.IntervalMs) {
		t.Fatalf("decoded %+v", req)
	}
	for _, body := range []string{"", " \n\t", "{}"} {
		if err := subjects.DecodeNoFields([]byte(body)); err != nil {
			t.Errorf("%q: %v", body, err)
		}
	}
}

func TestStrictTypeErrors(t *testing.T) {
	for body, msg := range map[string]string{
		`{"duration_ms":1,"summary":5}`:    "summary must be a JSON string, not number",
		`{"duration_ms":1,"summary":true}`: "summary must be a JSON string, not boolean",
		`{"duration_ms":1,"summary":[]}`:   "summary must be a JSON string, not array",
		`{"duration_ms":1,"summary":{}}`:   "summary must be a JSON string, not object",
	} {
		_, err := timers.DecodeCreateTimer([]byte(body), timers.TimerLimits{})
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != subjects.CodeInvalidRequest || e.Message != msg {
			t.Errorf("%s: %v, want %s", body, err, msg)
		}
	}
}

func TestCallbackBodyStrict(t *testing.T) {
	for _, tc := range []struct{ body, msg string }{
		{`{"text":"benign","text":"evil"}`, `malformed JSON body: duplicate key "text"`},
		{"{\"text\":\"\xff\"}", "malformed JSON body: invalid UTF-8: byte 0xff at offset 9"},
		{`{"text":"\udc00"}`, `malformed JSON body: invalid UTF-8: lone surrogate \udc00 at offset 9`},
		{`{"text":"a"} {}`, "malformed JSON body: unexpected data after the object"},
		{`[1] 2`, "malformed JSON body: unexpected data after the value"},
		{`{"text":`, "malformed JSON body: unexpected EOF"},
	} {
		_, err := callbacks.DecodeCallbackBody("application/json", []byte(tc.body))
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != subjects.CodeInvalidJSON || e.Message != tc.msg {
			t.Errorf("%q: %v, want %s", tc.body, err, tc.msg)
		}
		// Without a content type the same body is not JSON: kept as bytes.
		p, err := callbacks.DecodeCallbackBody("", []byte(tc.body))
		if err != nil || p.JSON != nil || p.ContentType != "application/octet-stream" {
			t.Errorf("untyped %q: %+v %v", tc.body, p, err)
		}
	}
	// The text of a message is the member "text" exactly.
	p, err := callbacks.DecodeCallbackBody("application/json", []byte(`{"TEXT":"shout"}`))
	if err != nil || p.MessageText() != `{"TEXT":"shout"}` {
		t.Errorf("TEXT: %+v %v", p, err)
	}
}
