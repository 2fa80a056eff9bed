package timers_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

func TestCreateTimerRequestValidation(t *testing.T) {
	cases := []struct {
		body string
		want error  // nil: valid
		msg  string // expected message, when want != nil
	}{
		{`{"duration_ms":1000}`, nil, ""},
		{`{"duration_ms":1000,"interval_ms":500,"summary":"s"}`, nil, ""},
		{`{}`, subjects.ErrInvalidRequest, "duration_ms is required"},
		{``, subjects.ErrInvalidRequest, "duration_ms is required"},
		{`{"duration_ms":null}`, subjects.ErrInvalidRequest, "duration_ms is required"},
		{`{"duration_ms":0}`, subjects.ErrInvalidRequest, "duration_ms must be a positive integer, not 0"},
		{`{"duration_ms":-5}`, subjects.ErrInvalidRequest, "duration_ms must be a positive integer, not -5"},
		{`{"duration_ms":1.5}`, subjects.ErrInvalidRequest, "duration_ms must be a positive integer, not 1.5"},
		{`{"duration_ms":"100"}`, subjects.ErrInvalidRequest, `duration_ms must be a positive integer, not "100"`},
		{`{"duration_ms":99999999999999999999}`, subjects.ErrInvalidRequest, "duration_ms is too large: at most 3153600000000"},
		{`{"duration_ms":1e30}`, subjects.ErrInvalidRequest, "duration_ms is too large: at most 3153600000000"},
		{`{"duration_ms":3153600000001}`, subjects.ErrInvalidRequest, "duration_ms is too large: at most 3153600000000"},
		{`{"duration_ms":10,"interval_ms":0}`, subjects.ErrInvalidRequest, "interval_ms must be a positive integer, not 0"},
		{`{"duration_ms":10,"interval_ms":2.5}`, subjects.ErrInvalidRequest, "interval_ms must be a positive integer, not 2.5"},
		{`{"duration_ms":10,"bogus":1}`, subjects.ErrInvalidRequest, `unknown field "bogus"`},
		{`{"duration_ms":10,"summary":5}`, subjects.ErrInvalidRequest, "summary must be a JSON string, not number"},
		{`{"duration_ms":10,"summary":"` + strings.Repeat("x", timers.MaxSummaryLen+1) + `"}`, subjects.ErrInvalidRequest, "summary must be at most 4096 characters"},
		{`{"duration_ms":`, subjects.ErrInvalidJSON, ""},
		{`[1]`, subjects.ErrInvalidJSON, "request body must be a JSON object"},
		{`{"duration_ms":10} {}`, subjects.ErrInvalidJSON, "malformed JSON: unexpected data after the object"},
	}
	for _, c := range cases {
		var req timers.CreateTimerRequest
		err := subjects.DecodeStrict([]byte(c.body), &req)
		if err == nil {
			_, err = req.Validate(timers.TimerLimits{})
		}
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: unexpected error %v", c.body, err)
			}
			continue
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%.60s: error %v, want code %s", c.body, err, c.want.(*subjects.Error).Code)
			continue
		}
		if c.msg != "" && subjects.AsError(err).Message != c.msg {
			t.Errorf("%.60s: message %q, want %q", c.body, subjects.AsError(err).Message, c.msg)
		}
	}
}

// TestMinInterval: an interval below the operator's minimum is an
// invalid_request that says the minimum and is marked for the quota
// metric; the minimum itself, and one-shots of any duration, pass.
func TestMinInterval(t *testing.T) {
	limits := timers.TimerLimits{MinInterval: time.Second}
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"duration_ms":1,"interval_ms":1}`, false},
		{`{"duration_ms":1000,"interval_ms":999}`, false},
		{`{"duration_ms":1000,"interval_ms":1000}`, true},
		{`{"duration_ms":1}`, true},
		{`{"duration_ms":1,"interval_ms":null}`, true},
	} {
		var req timers.CreateTimerRequest
		if err := subjects.DecodeStrict([]byte(tc.body), &req); err != nil {
			t.Fatal(err)
		}
		_, err := req.Validate(limits)
		if tc.ok {
			if err != nil {
				t.Errorf("%s: %v", tc.body, err)
			}
			continue
		}
		if !errors.Is(err, subjects.ErrInvalidRequest) || !errors.Is(err, timers.ErrIntervalTooShort) ||
			subjects.AsError(err).Message != "interval_ms must be at least 1000" {
			t.Errorf("%s: %v", tc.body, err)
		}
	}
	// Without a minimum any positive interval passes.
	req := timers.CreateTimerRequest{DurationMs: []byte("1"), IntervalMs: []byte("1")}
	if _, err := req.Validate(timers.TimerLimits{}); err != nil {
		t.Fatal(err)
	}
}

func TestValidateID(t *testing.T) {
	for _, id := range []string{"a", "demo-1", "A_b-9", strings.Repeat("x", 64)} {
		if err := subjects.ValidateID("agent_id", id); err != nil {
			t.Errorf("%q: %v", id, err)
		}
	}
	for _, id := range []string{"", "a.b", "*", ">", "a b", strings.Repeat("x", 65), "é"} {
		if err := subjects.ValidateID("agent_id", id); !errors.Is(err, subjects.ErrInvalidID) {
			t.Errorf("%q: %v, want invalid_id", id, err)
		}
	}
}

func TestLegacyScheduledReadsActive(t *testing.T) {
	var s timers.TimerStatus
	if err := s.UnmarshalJSON([]byte(`"scheduled"`)); err != nil || s != timers.TimerActive {
		t.Fatalf("got %q, %v", s, err)
	}
}

func TestParseAgent(t *testing.T) {
	if id, err := subjects.ParseAgent("agent.demo.timer.create"); err != nil || id != "demo" {
		t.Fatalf("got %q, %v", id, err)
	}
	if _, err := subjects.ParseAgent("agent.*.timer.create"); !errors.Is(err, subjects.ErrInvalidID) {
		t.Fatalf("wildcard agent accepted: %v", err)
	}
}

// TestLongestTimerStaysRepresentable: the longest timer's due time, and
// its first repeat, lie after now (an overflowed due time fired at once).
func TestLongestTimerStaysRepresentable(t *testing.T) {
	req := timers.CreateTimerRequest{DurationMs: []byte("3153600000000"), IntervalMs: []byte("3153600000000")}
	spec, err := req.Validate(timers.TimerLimits{MinInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	due := now.Add(spec.Duration)
	if !due.After(now) || !due.Add(spec.Interval).After(due) || due.UnixNano() <= now.UnixNano() {
		t.Fatalf("due %v, next %v", due, due.Add(spec.Interval))
	}
}

func TestParseRecordKey(t *testing.T) {
	if a, id, ok := subjects.ParseRecordKey(subjects.TimerKey("agent-1", "tmr_x")); !ok || a != "agent-1" || id != "tmr_x" {
		t.Fatalf("record key: %q %q %v", a, id, ok)
	}
	for _, k := range []string{"agent", ".t", "a.", "_chime.probe.r1", "rec.a.t"} {
		if _, _, ok := subjects.ParseRecordKey(k); ok {
			t.Errorf("%q taken for a record key", k)
		}
	}
}
