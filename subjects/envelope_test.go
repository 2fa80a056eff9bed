package subjects_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// TimerFiredMsg must be exactly the generic envelope encoding, for any
// summary text.
func TestTimerFiredMsgMatchesEnvelope(t *testing.T) {
	for _, text := range []string{"", "check the CI run", `quote " and \ back`, "<a&b>", "tab\tnl\ncr\r\x00\x1f\x7f", "é ✓ 日本", "\u2028\u2029", "bad \xff\xfe utf8", "timer tmr_1 fired"} {
		checkTimerFired(t, text, 7, false)
		checkTimerFired(t, text, 8, false) // a repeating timer's, with next_due_at
		checkTimerFired(t, text, 7, true)  // a calendar fire: scheduled_at, an ID by its time
		checkTimerFired(t, text, 8, true)  // both
	}
}

func FuzzTimerFiredMsg(f *testing.F) {
	f.Add("summary", int64(1))
	f.Add("\x00<>&\u2028\xff", int64(1<<40))
	f.Fuzz(func(t *testing.T, text string, occ int64) {
		checkTimerFired(t, text, occ, occ%2 == 0)
	})
}

func checkTimerFired(t *testing.T, text string, occ int64, calendar bool) {
	t.Helper()
	due := time.Date(2026, 12, 3, 10, 0, 0, 123456789, time.UTC)
	ev := &timers.TimerFired{AgentID: "agent_1", TimerID: "tmr_X", Occurrence: occ, DueAt: due, FiredAt: due.Add(1500 * time.Microsecond), Text: text, Calendar: calendar}
	if occ%2 == 0 {
		next := due.Add(3 * time.Second)
		ev.NextDue = &next
	}
	env := timers.TimerFiredEnvelope(ev)
	want, err := env.Msg()
	if err != nil {
		t.Fatal(err)
	}
	got := timers.TimerFiredMsg(ev)
	if !bytes.Equal(got.Data, want.Data) {
		t.Fatalf("text %q:\n got %s\nwant %s", text, got.Data, want.Data)
	}
	if got.Subject != want.Subject || got.Header.Get(subjects.HeaderMsgID) != want.Header.Get(subjects.HeaderMsgID) || got.Header.Get(subjects.HeaderKind) != want.Header.Get(subjects.HeaderKind) {
		t.Fatalf("subject or headers differ: %v %v", got.Header, want.Header)
	}
}
