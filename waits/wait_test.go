package waits_test

import (
	"errors"
	"testing"
	"time"

	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/subjects/subjectstest"
	"github.com/chime-nats/chime/waits"
)

func TestRemainingText(t *testing.T) {
	for _, tc := range []struct {
		s    float64
		want string
	}{
		{-3, "0.0s remaining"},
		{0, "0.0s remaining"},
		{0.05, "0.1s remaining"},
		{5, "5.0s remaining"},
		{12.5, "12.5s remaining"},
		{59.96, "1m remaining"},
		{60, "1m remaining"},
		{61.5, "1m 1.5s remaining"},
		{3599.9, "59m 59.9s remaining"},
		{3599.96, "1h remaining"},
		{3600, "1h remaining"},
		{3661, "1h 1m 1s remaining"},
		{86401, "1d 1s remaining"},
		{90061.7, "1d 1h 1m 1s remaining"},
	} {
		if got := waits.RemainingText(tc.s); got != tc.want {
			t.Errorf("RemainingText(%v) = %q, want %q", tc.s, got, tc.want)
		}
	}
	if got := waits.WaitHeading(waits.RemainingText(5)); got != "icon://timer Wait: 5.0s remaining" {
		t.Errorf("heading %q", got)
	}
}

func TestWaitRequestRules(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	berlin, _ := time.LoadLocation("Europe/Berlin")
	for _, tc := range []struct {
		name, body, tz string
		mode           waits.WaitMode
		target         time.Time
		code, msg      string
	}{
		{name: "seconds", body: `{"seconds":5}`, mode: waits.WaitDuration, target: now.Add(5 * time.Second)},
		{name: "summed", body: `{"seconds":1,"minutes":1,"hours":1,"days":1}`, mode: waits.WaitDuration, target: now.Add(90061 * time.Second)},
		{name: "fraction truncates", body: `{"seconds":1.5}`, mode: waits.WaitDuration, target: now.Add(time.Second)},
		{name: "integer string", body: `{"minutes":"2"}`, mode: waits.WaitDuration, target: now.Add(2 * time.Minute)},
		{name: "negative part", body: `{"minutes":1,"seconds":-30}`, mode: waits.WaitDuration, target: now.Add(30 * time.Second)},
		{name: "zero", body: `{"seconds":0}`, code: waits.CodeInvalidDuration, msg: "Wait duration must be positive."},
		{name: "empty", body: `{}`, code: waits.CodeInvalidDuration, msg: "Wait duration must be positive."},
		{name: "sub-second", body: `{"seconds":0.9}`, code: waits.CodeInvalidDuration, msg: "Wait duration must be positive."},
		{name: "negative", body: `{"seconds":-5}`, code: waits.CodeInvalidDuration, msg: "Wait duration must be positive."},
		{name: "not a number", body: `{"seconds":"soon"}`, code: waits.CodeInvalidDuration, msg: `seconds must be a number, not "soon"`},
		{name: "bool", body: `{"seconds":true}`, code: waits.CodeInvalidDuration, msg: "seconds must be a number, not true"},
		{name: "huge", body: `{"days":1e300}`, code: waits.CodeInvalidDuration, msg: "days is too large"},
		{name: "until wins", body: `{"seconds":5,"until":"2026-12-03T11:00:00Z"}`, mode: waits.WaitUntil, target: now.Add(time.Hour)},
		{name: "offset", body: `{"until":"2026-12-03T12:00:00+01:00"}`, mode: waits.WaitUntil, target: now.Add(time.Hour)},
		{name: "naive in tz", body: `{"until":"2026-12-03T12:00:00","tz":"Europe/Berlin"}`, mode: waits.WaitUntil, target: time.Date(2026, 12, 3, 12, 0, 0, 0, berlin)},
		{name: "naive in default tz", tz: "Europe/Berlin", body: `{"until":"2026-12-03 12:00:00"}`, mode: waits.WaitUntil, target: time.Date(2026, 12, 3, 12, 0, 0, 0, berlin)},
		{name: "fallback minutes", body: `{"until":"2026-12-03 10:30"}`, mode: waits.WaitUntil, target: now.Add(30 * time.Minute)},
		{name: "fallback date", body: `{"until":"2026-12-04"}`, mode: waits.WaitUntil, target: time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)},
		{name: "fraction", body: `{"until":"2026-12-03T10:00:01.5Z"}`, mode: waits.WaitUntil, target: now.Add(1500 * time.Millisecond)},
		{name: "garbage", body: `{"until":"tomorrow"}`, code: waits.CodeInvalidTimestamp, msg: "Invalid timestamp format: tomorrow"},
		{name: "past", body: `{"until":"2026-12-03T09:00:00Z"}`, code: waits.CodeTargetInPast, msg: "Target time 2026-12-03T09:00:00+00:00 is in the past."},
		{name: "past naive in tz", body: `{"until":"2026-12-03 10:30:00","tz":"Europe/Berlin"}`, code: waits.CodeTargetInPast, msg: "Target time 2026-12-03T10:30:00+01:00 is in the past."},
		{name: "now is past", body: `{"until":"2026-12-03T10:00:00Z"}`, code: waits.CodeTargetInPast, msg: "Target time 2026-12-03T10:00:00+00:00 is in the past."},
		{name: "bad tz", body: `{"until":"2026-12-04","tz":"Mars/Olympus"}`, code: waits.CodeInvalidTimezone, msg: "Unknown time zone: Mars/Olympus"},
		{name: "bad id", body: `{"seconds":5,"id":"a.b"}`, code: subjects.CodeInvalidID},
		{name: "unknown field", body: `{"secs":5}`, code: subjects.CodeInvalidRequest, msg: `unknown field "secs"`},
		{name: "malformed", body: `{"seconds":`, code: subjects.CodeInvalidJSON},
		{name: "not an object", body: `[5]`, code: subjects.CodeInvalidJSON},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := waits.DecodeWaitRequest([]byte(tc.body), now, tc.tz)
			if tc.code != "" {
				var e *subjects.Error
				if !errors.As(err, &e) || e.Code != tc.code || (tc.msg != "" && e.Message != tc.msg) {
					t.Fatalf("err = %v, want %s: %s", err, tc.code, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if spec.Mode != tc.mode || !spec.Target.Equal(tc.target) {
				t.Fatalf("got %s %v, want %s %v", spec.Mode, spec.Target, tc.mode, tc.target)
			}
		})
	}
}

func TestFormatISO(t *testing.T) {
	tokyo, _ := time.LoadLocation("Asia/Tokyo")
	for _, tc := range []struct {
		t    time.Time
		want string
	}{
		{time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "2026-01-02T03:04:05+00:00"},
		{time.Date(2026, 1, 2, 3, 4, 5, 120000000, time.UTC), "2026-01-02T03:04:05.120000+00:00"},
		{time.Date(2026, 1, 2, 3, 4, 5, 999, tokyo), "2026-01-02T03:04:05+09:00"},
	} {
		if got := subjects.FormatISO(tc.t); got != tc.want {
			t.Errorf("FormatISO = %q, want %q", got, tc.want)
		}
	}
}

func TestDecodeIntervention(t *testing.T) {
	for body, want := range map[string]string{
		`{"action":"message","text":"stop that"}`: "",
		`{"action":"stop"}`:                       "",
		`{"action":"pause"}`:                      "",
		`{"action":"resume"}`:                     "",
		`{"action":"message"}`:                    "text is required for action message",
		`{}`:                                      "action is required: message, pause, resume or stop",
		`{"action":"Pause"}`:                      `unknown action "Pause": message, pause, resume or stop`,
		`{"action":"stop","by":"me"}`:             `unknown field "by"`,
	} {
		_, err := interventions.DecodeIntervention([]byte(body))
		if want == "" && err != nil || want != "" && (err == nil || err.(*subjects.Error).Message != want) {
			t.Errorf("%s: err %v, want %q", body, err, want)
		}
	}
}

func TestPausedWaitClockStands(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	paused := t0.Add(2 * time.Second)
	w := waits.Wait{Mode: waits.WaitDuration, Status: waits.WaitWaiting, TargetTime: t0.Add(10 * time.Second), PausedAt: &paused}
	if got := w.Remaining(t0.Add(5 * time.Second)); got != 8*time.Second {
		t.Errorf("remaining while paused = %v, want 8s", got)
	}
	if w.Armed() {
		t.Error("a paused duration wait is armed")
	}
	w.Mode = waits.WaitUntil
	if !w.Armed() || w.Remaining(t0.Add(5*time.Second)) != 5*time.Second {
		t.Error("an until wait's clock runs through a pause")
	}
}

func FuzzParseUntil(f *testing.F) {
	for _, s := range []string{"2026-12-03T10:00:00Z", "2026-12-03 10:00", "2026-12-03", "tomorrow", "", "2026-13-45T99:99:99+99:99"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := waits.ParseUntil(s, time.UTC)
		if err != nil {
			var e *subjects.Error
			if !errors.As(err, &e) || e.Code != waits.CodeInvalidTimestamp || e.Message != "Invalid timestamp format: "+s {
				t.Fatalf("ParseUntil(%q): %v", s, err)
			}
			return
		}
		// What was accepted round-trips through the ISO form agents are shown.
		back, err := waits.ParseUntil(subjects.FormatISO(got), time.UTC)
		if err != nil || !back.Equal(got.Truncate(time.Microsecond)) {
			t.Fatalf("ParseUntil(%q) = %v; its ISO form %q reads back as %v, %v", s, got, subjects.FormatISO(got), back, err)
		}
	})
}

func FuzzDecodeWaitRequest(f *testing.F) {
	subjectstest.AddSeeds(f, `{"seconds":5}`, `{"until":"2026-12-04","tz":"Europe/Berlin"}`, `{"days":"3"}`, `{"seconds":1e400}`,
		`{"minutes":1,"seconds":-30,"id":"w-1"}`, `{"until":"2026-12-03T09:00:00Z"}`, `{"tz":"Mars/Olympus","seconds":1}`)
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	decode := func(body []byte) (*waits.WaitSpec, error) { return waits.DecodeWaitRequest(body, now, "") }
	keys := []string{"seconds", "minutes", "hours", "days", "until", "tz", "id"}
	codes := []string{subjects.CodeInvalidJSON, subjects.CodeInvalidRequest, subjects.CodeInvalidID, waits.CodeInvalidDuration, waits.CodeInvalidTimestamp, waits.CodeTargetInPast, waits.CodeInvalidTimezone}
	subjectstest.Request(f, decode, keys, codes, func(t *testing.T, body []byte, spec *waits.WaitSpec) {
		if !spec.Target.After(now) || (spec.Mode != waits.WaitDuration && spec.Mode != waits.WaitUntil) ||
			(spec.Mode == waits.WaitDuration && spec.Target.Sub(now) > waits.MaxWaitSeconds*time.Second) {
			t.Fatalf("accepted %s with target %v mode %q", body, spec.Target, spec.Mode)
		}
		// The same target, asked for the way the reply shows it.
		req := map[string]any{"id": spec.ID, "tz": spec.TZ}
		if spec.Mode == waits.WaitUntil {
			req["until"] = subjects.FormatISO(spec.Target)
		} else {
			req["seconds"] = int64(spec.Target.Sub(now) / time.Second)
		}
		back, err := decode(subjectstest.EncodeBody(t, req))
		if err != nil || back.Mode != spec.Mode || back.ID != spec.ID || back.TZ != spec.TZ || !back.Target.Equal(spec.Target.Truncate(time.Microsecond)) {
			t.Fatalf("%s accepted as %+v, which reads back as %+v (%v)", body, spec, back, err)
		}
	})
}
