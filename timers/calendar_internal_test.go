package timers

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The DST zones the calendar is held to: a one-hour shift on either side
// of the Atlantic, and Lord Howe's half hour.
var dstZones = []string{"America/New_York", "Europe/Berlin", "Australia/Lord_Howe"}

// transitions are loc's offset changes in year.
func transitions(loc *time.Location, year int) []time.Time {
	var out []time.Time
	t := time.Date(year, 1, 1, 0, 0, 0, 0, loc)
	stop := time.Date(year+1, 1, 1, 0, 0, 0, 0, loc)
	for {
		_, end := t.ZoneBounds()
		if end.IsZero() || !end.Before(stop) {
			return out
		}
		out = append(out, end)
		t = end
	}
}

// reference lists the fires of cal in (a, b] the slow way: every wall
// time the expression names, each placed on the time line by trying every
// offset the zone has around then, the policy applied by its definition.
func reference(cal *Calendar, a, b time.Time) []time.Time {
	offs := map[int64]bool{}
	var trans []time.Time
	for t := a.Add(-72 * time.Hour); !t.After(b.Add(72 * time.Hour)); t = t.Add(time.Hour) {
		offs[offsetAt(t, cal.loc)] = true
	}
	for y := a.Year() - 1; y <= b.Year()+1; y++ {
		trans = append(trans, transitions(cal.loc, y)...)
	}
	var out []time.Time
	w := naive(a.Add(-72*time.Hour), cal.loc)
	stop := naive(b.Add(72*time.Hour), cal.loc)
	for {
		w = cal.sched.Next(w)
		if w.IsZero() || w.After(stop) {
			break
		}
		var valid []time.Time
		for o := range offs {
			t := time.Unix(w.Unix()-o, 0)
			if naive(t, cal.loc).Equal(w) {
				valid = append(valid, t)
			}
		}
		slices.SortFunc(valid, time.Time.Compare)
		switch {
		case len(valid) == 1:
			out = append(out, valid[0])
		case len(valid) == 2 && cal.repeated == DSTFirst:
			out = append(out, valid[0])
		case len(valid) == 2 && cal.repeated == DSTLast:
			out = append(out, valid[1])
		case len(valid) == 2:
			out = append(out, valid...)
		case len(valid) == 0 && cal.skipped == DSTShift:
			for _, tr := range trans {
				if naive(tr.Add(-time.Second), cal.loc).Before(w) && naive(tr, cal.loc).After(w) {
					out = append(out, tr)
				}
			}
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	out = slices.CompactFunc(out, time.Time.Equal)
	return slices.DeleteFunc(out, func(t time.Time) bool { return !t.After(a) || t.After(b) })
}

// cronGen draws expressions that touch the hours DST moves: every few
// minutes, fixed minutes of the small hours, daily, hourly, seconds.
func cronGen() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		minute := rapid.SampledFrom([]string{"0", "15", "30", "45", "*/5", "*/15", "*/30", "10,40", fmt.Sprint(rapid.IntRange(0, 59).Draw(t, "m"))}).Draw(t, "minute")
		hour := rapid.SampledFrom([]string{"*", "1", "2", "3", "0-4", "1,2", "*/2", fmt.Sprint(rapid.IntRange(0, 23).Draw(t, "h"))}).Draw(t, "hour")
		expr := minute + " " + hour + " * * *"
		switch rapid.IntRange(0, 5).Draw(t, "form") {
		case 0:
			expr = "0,30 " + expr // six fields
		case 1:
			expr = rapid.SampledFrom([]string{"@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@midnight"}).Draw(t, "alias")
		}
		return expr
	})
}

// TestCalendarAcrossDST: for every zone, DST policy and drawn expression,
// the fires around a drawn transition are the reference's, in order, and
// each policy does what it says.
func TestCalendarAcrossDST(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		zone := rapid.SampledFrom(dstZones).Draw(t, "zone")
		spec := CalendarSpec{Cron: cronGen().Draw(t, "cron"), TZ: zone,
			DSTRepeated: rapid.SampledFrom([]string{DSTFirst, DSTLast, DSTBoth}).Draw(t, "repeated"),
			DSTSkipped:  rapid.SampledFrom([]string{DSTShift, DSTSkip}).Draw(t, "skipped")}
		cal, err := spec.Compile("tmr_x")
		if err != nil {
			t.Fatal(err)
		}
		trs := transitions(cal.loc, rapid.IntRange(2024, 2030).Draw(t, "year"))
		tr := trs[rapid.IntRange(0, len(trs)-1).Draw(t, "which")]
		a := tr.Add(-time.Duration(rapid.Int64Range(0, int64(30*time.Hour)).Draw(t, "before")))
		b := tr.Add(30 * time.Hour)
		if slices.Contains([]string{"@weekly", "@monthly", "@yearly"}, spec.Cron) {
			b = a.Add(400 * 24 * time.Hour)
		}
		var got []time.Time
		for at := a; ; {
			n, ok := cal.Next(at)
			if !ok || n.After(b) {
				break
			}
			if !n.After(at) {
				t.Fatalf("Next(%s) = %s: not after", at, n)
			}
			got = append(got, n)
			at = n
		}
		want := reference(cal, a, b)
		if !slices.EqualFunc(got, want, time.Time.Equal) {
			t.Fatalf("%s in %s (%s/%s) from %s:\n got %s\nwant %s", spec.Cron, zone, spec.DSTRepeated, spec.DSTSkipped, a, show(got, cal.loc), show(want, cal.loc))
		}
		// The policies, stated directly.
		walls := map[time.Time]int{}
		for _, n := range got {
			w := naive(n, cal.loc)
			matched := cal.sched.Next(w.Add(-time.Second)).Equal(w)
			if !matched {
				// Only a shift fire is off the expression: at a transition,
				// standing for a wall time the clocks skipped.
				if spec.DSTSkipped != DSTShift || !slices.ContainsFunc(trs, n.Equal) && !isTransition(cal.loc, n) {
					t.Fatalf("fire %s (wall %s) is not named by %s", n, w, spec.Cron)
				}
				continue
			}
			walls[w]++
			if twice := len(ambiguous(cal, w)) == 2; twice {
				inst := ambiguous(cal, w)
				switch spec.DSTRepeated {
				case DSTFirst:
					if !n.Equal(inst[0]) {
						t.Fatalf("repeated wall %s fired at %s, not the first", w, n)
					}
				case DSTLast:
					if !n.Equal(inst[1]) {
						t.Fatalf("repeated wall %s fired at %s, not the last", w, n)
					}
				}
			}
		}
		for w, c := range walls {
			if c > 1 && spec.DSTRepeated != DSTBoth {
				t.Fatalf("wall %s fired %d times under %s", w, c, spec.DSTRepeated)
			}
			inst := ambiguous(cal, w)
			if c == 1 && spec.DSTRepeated == DSTBoth && len(inst) == 2 && inst[0].After(a) && !inst[1].After(b) {
				t.Fatalf("repeated wall %s fired once under both", w)
			}
		}
	})
}

func isTransition(loc *time.Location, t time.Time) bool {
	return offsetAt(t.Add(-time.Nanosecond), loc) != offsetAt(t, loc)
}

// ambiguous are the instants of wall time w, however many.
func ambiguous(cal *Calendar, w time.Time) []time.Time {
	var out []time.Time
	for _, o := range []int64{-5 * 3600, -4 * 3600, 3600, 7200, 10 * 3600, 10*3600 + 1800, 11 * 3600} {
		t := time.Unix(w.Unix()-o, 0)
		if naive(t, cal.loc).Equal(w) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

func show(ts []time.Time, loc *time.Location) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.In(loc).Format("01-02 15:04:05 MST"))
	}
	return out
}

// TestCalendarDSTExamples pins the defaults on the days clocks change.
func TestCalendarDSTExamples(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	lh, _ := time.LoadLocation("Australia/Lord_Howe")
	cases := []struct {
		cron, tz, repeated, skipped string
		from                        time.Time
		want                        []string // RFC 3339
	}{
		// Spring forward: 02:30 does not exist; shift fires at the jump.
		{"30 2 * * *", "America/New_York", "", "", time.Date(2026, 3, 7, 12, 0, 0, 0, ny), []string{"2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"}},
		{"30 2 * * *", "America/New_York", "", DSTSkip, time.Date(2026, 3, 7, 12, 0, 0, 0, ny), []string{"2026-03-09T02:30:00-04:00"}},
		// Fall back: 01:30 happens twice.
		{"30 1 * * *", "America/New_York", "", "", time.Date(2026, 10, 31, 12, 0, 0, 0, ny), []string{"2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"}},
		{"30 1 * * *", "America/New_York", DSTLast, "", time.Date(2026, 10, 31, 12, 0, 0, 0, ny), []string{"2026-11-01T01:30:00-05:00", "2026-11-02T01:30:00-05:00"}},
		{"30 1 * * *", "America/New_York", DSTBoth, "", time.Date(2026, 10, 31, 12, 0, 0, 0, ny), []string{"2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00-05:00"}},
		// Lord Howe goes forward half an hour at 02:00 (to 02:30) on
		// 2026-10-04 and back at 02:00 (to 01:30) on 2026-04-05.
		{"15 2 * * *", "Australia/Lord_Howe", "", "", time.Date(2026, 10, 3, 12, 0, 0, 0, lh), []string{"2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"}},
		{"45 1 * * *", "Australia/Lord_Howe", DSTBoth, "", time.Date(2026, 4, 4, 12, 0, 0, 0, lh), []string{"2026-04-05T01:45:00+11:00", "2026-04-05T01:45:00+10:30"}},
	}
	for _, c := range cases {
		cal, err := (&CalendarSpec{Cron: c.cron, TZ: c.tz, DSTRepeated: c.repeated, DSTSkipped: c.skipped}).Compile("tmr_x")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		at := c.from
		for range len(c.want) {
			n, ok := cal.Next(at)
			if !ok {
				break
			}
			got = append(got, n.In(cal.loc).Format(time.RFC3339))
			at = n
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %s %s/%s: got %v, want %v", c.cron, c.tz, c.repeated, c.skipped, got, c.want)
		}
	}
}

// TestCalendarJitter: the same timer and scheduled time get the same
// jitter; it stays within its share of the period and its cap; two timers
// on one schedule spread.
func TestCalendarJitter(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		share := rapid.Float64Range(0, 0.99).Draw(t, "share")
		capMs := rapid.Int64Range(1, 3_600_000).Draw(t, "cap")
		spec := CalendarSpec{Cron: "*/15 * * * *", TZ: rapid.SampledFrom(dstZones).Draw(t, "zone"), Jitter: share, JitterMaxMs: capMs}
		a, _ := spec.Compile("tmr_a")
		a2, _ := spec.Compile("tmr_a")
		s := time.Unix(rapid.Int64Range(1.7e9, 1.9e9).Draw(t, "at"), 0).Truncate(15 * time.Minute)
		j := a.Jitter(s)
		if j != a2.Jitter(s) {
			t.Fatal("jitter differs between two compiles of one timer")
		}
		if bound := min(time.Duration(share*float64(15*time.Minute)), time.Duration(capMs)*time.Millisecond); j < 0 || (bound > 0 && j >= bound) || (bound == 0 && j != 0) {
			t.Fatalf("jitter %s outside [0, %s)", j, bound)
		}
	})
	spec := CalendarSpec{Cron: "0 * * * *", Jitter: 0.5, JitterMaxMs: 600_000}
	seen := map[time.Duration]bool{}
	s := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	for i := range 20 {
		c, _ := spec.Compile(fmt.Sprintf("tmr_%d", i))
		seen[c.Jitter(s)] = true
	}
	if len(seen) < 15 {
		t.Fatalf("20 timers on one schedule got only %d distinct jitters", len(seen))
	}
}

// TestCalendarStep: each catch-up policy's decision on an occurrence
// reached on time, and an hour late.
func TestCalendarStep(t *testing.T) {
	s := time.Date(2026, 6, 1, 9, 0, 0, 0, time.UTC)
	compile := func(c CalendarSpec) *Calendar {
		c.Cron = "* * * * *"
		cal, err := c.Compile("tmr_x")
		if err != nil {
			t.Fatal(err)
		}
		return cal
	}
	minute := time.Minute
	cases := []struct {
		name        string
		spec        CalendarSpec
		now         time.Time
		fire, late  bool
		next        time.Time
		more        bool
		fireCountIn int64
	}{
		{"on time", CalendarSpec{}, s.Add(time.Second), true, false, s.Add(minute), true, 1},
		{"skip late", CalendarSpec{CatchUp: CatchUpSkip}, s.Add(time.Hour), false, true, s.Add(time.Hour - time.Second*30 - minute + minute), true, 1},
		{"one late", CalendarSpec{}, s.Add(time.Hour), true, true, s.Add(time.Hour + minute), true, 1},
		{"one late, outside the window", CalendarSpec{CatchUpWindowMs: 600_000}, s.Add(time.Hour), false, true, s.Add(50 * minute), true, 1},
		{"all late", CalendarSpec{CatchUp: CatchUpAll}, s.Add(time.Hour), true, true, s.Add(minute), true, 1},
		{"all late, outside the window", CalendarSpec{CatchUp: CatchUpAll, CatchUpWindowMs: 600_000}, s.Add(time.Hour), false, true, s.Add(50 * minute), true, 1},
		{"max_fires reached", CalendarSpec{MaxFires: 3}, s.Add(time.Second), true, false, time.Time{}, false, 3},
		{"end_at", CalendarSpec{EndAt: &s}, s.Add(time.Second), true, false, time.Time{}, false, 1},
	}
	for _, c := range cases {
		p := compile(c.spec).Step(c.fireCountIn, s, c.now)
		if c.name == "skip late" {
			// The first not yet missed: within the grace (30 s for a
			// minute's period) before now.
			if p.Fire || !p.Late || !p.More || p.Next.Before(c.now.Add(-30*time.Second-time.Minute)) || p.Next.After(c.now.Add(time.Minute)) {
				t.Errorf("%s: %+v", c.name, p)
			}
			continue
		}
		if p.Fire != c.fire || p.Late != c.late || p.More != c.more || (c.more && !p.Next.Equal(c.next)) {
			t.Errorf("%s: got %+v, want fire %v late %v next %s more %v", c.name, p, c.fire, c.late, c.next, c.more)
		}
	}
}
