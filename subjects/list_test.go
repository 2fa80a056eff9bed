package subjects_test

import (
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

func TestCursorRoundTrip(t *testing.T) {
	for _, from := range [][]subjects.CursorPos{
		{{Buckets: 1, Bucket: 0, Seq: 42}},
		{{Buckets: 8, Bucket: 7, Seq: 1<<64 - 1, Scan: true}},
		{{Buckets: 1, Bucket: 1}, {Buckets: 1, Seq: 3}}, // wait.list: waits done, wait_for not
	} {
		action := subjects.ActionTimerList
		if len(from) == 2 {
			action = waits.ActionWaitList
		}
		c := subjects.EncodeCursor(action, from...)
		if c == "" || len(c) > subjects.MaxCursorLen {
			t.Fatalf("%+v: cursor %q", from, c)
		}
		back, err := subjects.ParseCursor(action, len(from), c)
		if err != nil || !slices.Equal(back, from) {
			t.Fatalf("%+v reads back as %+v (%v)", from, back, err)
		}
	}
	if c := subjects.EncodeCursor(waits.ActionWaitList, subjects.CursorPos{Buckets: 1, Bucket: 1}, subjects.CursorPos{Buckets: 2, Bucket: 2}); c != "" {
		t.Fatalf("every walk at its end: cursor %q, want none", c)
	}
}

// TestListRequestErrors: each bad limit or cursor has its own text.
func TestListRequestErrors(t *testing.T) {
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	taskCursor := subjects.EncodeCursor(tasks.ActionTaskList, subjects.CursorPos{Buckets: 1, Seq: 5})
	malformed := "cursor is not a next_cursor chime gave: list again without a cursor"
	for _, tc := range []struct{ body, msg string }{
		{`{"limit":0}`, "limit must be a positive integer, not 0"},
		{`{"limit":1001}`, "limit is too large: at most 1000"},
		{`{"limit":"5"}`, `limit must be a positive integer, not "5"`},
		{`{"cursor":5}`, "cursor must be a JSON string, not number"},
		{`{"cursor":"` + taskCursor + `"}`, "cursor is from a task.list listing, not timer.list"},
		{`{"cursor":"not base64!"}`, malformed},
		{`{"cursor":"` + enc("2|timer.list|1.0.5") + `"}`, malformed},
		{`{"cursor":"` + enc("1|timer.list|1.0") + `"}`, malformed},
		{`{"cursor":"` + enc("1|timer.list|1.2.5") + `"}`, malformed},
		{`{"cursor":"` + enc("1|timer.list|0.0.5") + `"}`, malformed},
		{`{"cursor":"` + enc("1|timer.list|1.0.-5") + `"}`, malformed},
		{`{"cursor":"` + enc("1|timer.list|1.0.5.x") + `"}`, malformed},
		{`{"cursor":"` + enc("1|timer.list|1.0.5,1.0.6") + `"}`, malformed},
		{`{"cursor":"` + strings.Repeat("A", subjects.MaxCursorLen+1) + `"}`, "cursor is too long: at most 256 characters"},
	} {
		_, err := timers.DecodeListTimers([]byte(tc.body))
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != subjects.CodeInvalidRequest || e.Message != tc.msg {
			t.Errorf("%s: got %v, want invalid_request: %s", tc.body, err, tc.msg)
		}
	}
	// No cursor, or an empty one, is the first page.
	for _, body := range []string{``, `{}`, `{"cursor":""}`, `{"limit":5}`} {
		if page, err := timers.DecodeListTimers([]byte(body)); err != nil || page.From != nil {
			t.Errorf("%q: %+v %v", body, page, err)
		}
	}
	// wait.list's cursor holds two places; a timer.list one is refused.
	if _, err := waits.DecodeListWaits([]byte(`{"cursor":"` + subjects.EncodeCursor(waits.ActionWaitList, subjects.CursorPos{Buckets: 1, Seq: 1}) + `"}`)); err == nil {
		t.Error("a wait.list cursor of one walk accepted")
	}
}
