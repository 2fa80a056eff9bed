package timers_test

import (
	"testing"
	"time"

	"github.com/chime-nats/chime/timers"
)

func TestNextOccurrenceKeepsCadence(t *testing.T) {
	due := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	iv := 10 * time.Second
	cases := []struct {
		now  time.Duration // after due
		want time.Duration // after due
	}{
		{0, 10 * time.Second},
		{3 * time.Second, 10 * time.Second},
		{10 * time.Second, 20 * time.Second}, // exactly on a point: the next one
		{95 * time.Second, 100 * time.Second},
	}
	for _, c := range cases {
		if got := timers.NextOccurrence(due, iv, due.Add(c.now)); !got.Equal(due.Add(c.want)) {
			t.Errorf("now=+%v: next=+%v, want +%v", c.now, got.Sub(due), c.want)
		}
	}
}
