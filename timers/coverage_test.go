package timers_test

import (
	"testing"
	"time"

	"github.com/chime-nats/chime/timers"
)

func TestCadenceCoverage(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	iv := time.Second
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	next := func(s float64) *time.Time { n := at(s); return &n }
	for _, c := range []struct {
		name      string
		fires     []timers.StoredFire
		uncovered int
	}{
		{"on time", []timers.StoredFire{
			{1, at(0), next(1), at(0.01)}, {2, at(1), next(2), at(1.01)}, {3, at(2), next(3), at(2.01)},
		}, 0},
		{"one late catch-up covers what fell due", []timers.StoredFire{
			{1, at(0), next(4), at(3.5)}, {2, at(4), next(5), at(4.01)},
		}, 0},
		{"stored on time, next jumped (a retry's clock)", []timers.StoredFire{
			{1, at(0), next(1), at(0.01)}, {2, at(1), next(2), at(1.01)}, {3, at(5), next(6), at(5.01)},
		}, 3},
		{"declared but stored before the ticks", []timers.StoredFire{
			{1, at(0), next(4), at(0.01)}, {2, at(4), next(5), at(4.01)},
		}, 3},
		{"earlier versions: stored time decides", []timers.StoredFire{
			{1, at(0), nil, at(2.5)}, {2, at(4), nil, at(4.01)},
		}, 1},
		{"a gap in numbers is a loss, not a skip", []timers.StoredFire{
			{1, at(0), next(1), at(0.01)}, {3, at(5), next(6), at(5.01)},
		}, 0},
		{"duplicates count once", []timers.StoredFire{
			{1, at(0), next(1), at(0.01)}, {1, at(0), next(1), at(0.02)}, {2, at(1), next(2), at(1.01)},
		}, 0},
	} {
		got := timers.CadenceCoverage(c.fires, iv)
		if got.Uncovered != c.uncovered {
			t.Errorf("%s: %d uncovered (%+v), want %d", c.name, got.Uncovered, got, c.uncovered)
		}
	}
}

// TestScheduleCoverage: a calendar timer's ticks are its schedule's, not
// a fixed interval's: seconds 0, 10 and 30 of each minute.
func TestScheduleCoverage(t *testing.T) {
	cal := timers.CalendarFor(&timers.Timer{ID: "c", CalendarSpec: timers.CalendarSpec{Cron: "0,10,30 * * * * *", TZ: "UTC"}}, nil)
	if cal == nil {
		t.Fatal("no calendar")
	}
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	next := func(s float64) *time.Time { n := at(s); return &n }
	for _, c := range []struct {
		name             string
		fires            []timers.StoredFire
		ticks, uncovered int
	}{
		{"on time", []timers.StoredFire{{1, at(0), next(10), at(0.01)}, {2, at(10), next(30), at(10.01)}, {3, at(30), next(60), at(30.01)}}, 3, 0},
		{"catch-up one covers 10 and 30", []timers.StoredFire{{1, at(0), next(60), at(45)}, {2, at(60), next(70), at(60.01)}}, 4, 0},
		{"jumped 10 and 30 silently", []timers.StoredFire{{1, at(0), next(10), at(0.01)}, {2, at(60), next(70), at(60.01)}}, 4, 2},
	} {
		got := timers.ScheduleCoverage(c.fires, cal.Next)
		if got.Ticks != c.ticks || got.Uncovered != c.uncovered {
			t.Errorf("%s: %+v, want %d ticks, %d uncovered", c.name, got, c.ticks, c.uncovered)
		}
	}
}
