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
