package mcp

import (
	"testing"
	"time"
)

func TestNextLook(t *testing.T) {
	now := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		wait time.Duration
		due  time.Time
		want time.Duration
	}{
		{"no due time", 800 * time.Millisecond, time.Time{}, 800 * time.Millisecond},
		{"due sooner than the backoff", 800 * time.Millisecond, now.Add(300 * time.Millisecond), 325 * time.Millisecond},
		{"due later than the backoff", 800 * time.Millisecond, now.Add(time.Hour), 800 * time.Millisecond},
		{"due now", 800 * time.Millisecond, now, 800 * time.Millisecond},
		{"overdue", 800 * time.Millisecond, now.Add(-5 * time.Second), 800 * time.Millisecond},
		{"due in a moment", 800 * time.Millisecond, now.Add(time.Millisecond), 26 * time.Millisecond},
	} {
		if got := nextLook(c.wait, c.due, now); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPollInterval(t *testing.T) {
	now := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		created time.Time
		due     time.Time
		want    int64
	}{
		{"young", now.Add(-time.Second), time.Time{}, 500},
		{"a minute old", now.Add(-30 * time.Second), time.Time{}, 2000},
		{"older", now.Add(-5 * time.Minute), time.Time{}, 5000},
		{"old", now.Add(-time.Hour), time.Time{}, 15000},
		{"due in 200 ms", now.Add(-time.Second), now.Add(200 * time.Millisecond), 225},
		{"due in a moment", now.Add(-time.Second), now.Add(time.Millisecond), 100},
		{"an old wait due in 3 s", now.Add(-time.Hour), now.Add(3 * time.Second), 3025},
	} {
		if got := pollInterval(c.created, c.due, now); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
