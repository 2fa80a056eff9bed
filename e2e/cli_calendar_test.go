package e2e_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/timers"
)

// TestCLICalendarTimers: the built binary makes a calendar timer, shows
// its next fires, pauses and resumes it with notes, refuses a bad zone,
// and lists it with its cron and zone.
func TestCLICalendarTimers(t *testing.T) {
	natsAddr := freeAddr(t)
	startServe(t, "clical", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)

	tm := cliTimer(t, natsAddr, "timer", "create", "--cron", "30 2 * * *", "--tz", "America/New_York", "--dst-repeated", "both",
		"--catchup", "all", "--catchup-window-ms", "600000", "--jitter", "0.1", "--max-fires", "3", "--summary", "nightly", "--agent", "cal")
	if tm.Cron != "30 2 * * *" || tm.TZ != "America/New_York" || tm.DSTRepeated != "both" || tm.DSTSkipped != "shift" || tm.CatchUp != "all" ||
		tm.CatchUpWindowMs != 600000 || tm.Jitter != 0.1 || tm.MaxFires != 3 || !tm.Repeat || tm.NextFireAt == nil {
		t.Fatalf("created: %+v", tm)
	}
	if w := tm.NextFireAt.In(mustZone(t, "America/New_York")); (w.Hour() != 2 || w.Minute() != 30) && w.Hour() != 3 {
		t.Fatalf("first fire %s is not 02:30 New York (or the jump over it)", w)
	}

	out, errOut, code := chimeCLI(t, natsAddr, "timer", "next", tm.ID, "count=10", "--agent", "cal")
	var next timers.NextTimerReply
	if code != 0 || json.Unmarshal([]byte(out), &next) != nil || len(next.Fires) != 3 || !next.Fires[0].ScheduledAt.Equal(*tm.NextFireAt) ||
		next.Fires[0].FireAt.Before(next.Fires[0].ScheduledAt) {
		t.Fatalf("timer next: exit %d %q %s", code, out, errOut)
	}

	if p := cliTimer(t, natsAddr, "timer", "pause", tm.ID, "note=holiday", "--agent", "cal"); p.Status != timers.TimerPaused || p.Note != "holiday" {
		t.Fatalf("pause: %+v", p)
	}
	if r := cliTimer(t, natsAddr, "timer", "resume", tm.ID, "note=back", "--agent", "cal"); r.Status != timers.TimerActive || r.Note != "back" {
		t.Fatalf("resume: %+v", r)
	}

	out, _, code = chimeCLI(t, natsAddr, "timer", "list", "--agent", "cal")
	if code != 0 || !strings.Contains(out, "30 2 * * *") || !strings.Contains(out, "America/New_York") {
		t.Fatalf("list table: %q", out)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"timer", "create", "--cron", "0 9 * * *", "--tz", "Mars/Olympus", "--agent", "cal"}, `tz "Mars/Olympus" is not an IANA time zone`},
		{[]string{"timer", "create", "--cron", "0 9 * *", "--agent", "cal"}, "want 5 fields"},
		{[]string{"timer", "create", "--cron", "0 9 * * *", "--after-ms", "5", "--agent", "cal"}, "--cron or --after-ms"},
		{[]string{"timer", "create", "--cron", "0 9 * * *", "--catchup", "some", "--agent", "cal"}, "catchup must be skip, one or all"},
	} {
		_, errOut, code := chimeCLI(t, natsAddr, tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errOut, tc.want)
		}
	}
}

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	l, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
