package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

// TestFlagMistakesSaidOnce: a bad or misplaced flag is refused before
// anything is sent, and said once (the flag package's line and usage, or
// chime's one error), never ignored.
func TestFlagMistakesSaidOnce(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // in the error, or in stderr when the flag package said it
	}{
		{[]string{"wait", "--minutes", "abc"}, `invalid value "abc" for flag -minutes`},
		{[]string{"wait", "--seconds", "5", "--minutes", "1"}, "wait takes one of --seconds, --minutes and --until, not --minutes and --seconds"},
		{[]string{"wait", "--minutes", "0.001"}, "--minutes 0.001 is less than a second"},
		{[]string{"wait", "--minutes", "-2"}, "--minutes must be positive"},
		{[]string{"wait", "--seconds", "5", "--tz", "Europe/Berlin"}, "--tz is for --until"},
		{[]string{"wait"}, "wait needs --seconds N, --minutes N or --until T"},
		{[]string{"timer", "list", "--every-ms", "5"}, "--every-ms is for timer create, not timer list"},
		{[]string{"timer", "create", "--after-ms", "5", "--limit", "3"}, "--limit is for timer list, not timer create"},
		{[]string{"timer", "get", "x", "--cron", "* * * * *"}, "--cron is for timer create, not timer get"},
	} {
		var stdout, stderr bytes.Buffer
		a := &App{Stdout: &stdout, Stderr: &stderr}
		err := a.Run(context.Background(), c.args)
		if !errors.Is(err, ErrUsage) {
			t.Errorf("%v: %v, not a usage error", c.args, err)
			continue
		}
		said := err.Error() + "\n" + stderr.String()
		if n := strings.Count(said, c.want); n != 1 {
			t.Errorf("%v: %q said %d times in %q", c.args, c.want, n, said)
		}
	}
}

func TestWaitLength(t *testing.T) {
	for _, c := range []struct {
		args             []string
		seconds, minutes int64
	}{
		{[]string{"--minutes", "0.05"}, 3, 0},
		{[]string{"--minutes", "2"}, 0, 2},
		{[]string{"--minutes", "1.5"}, 90, 0},
		{[]string{"--seconds", "7"}, 7, 0},
	} {
		fs := flag.NewFlagSet("wait", flag.ContinueOnError)
		s := fs.Int64("seconds", 0, "")
		m := fs.Float64("minutes", 0, "")
		u := fs.String("until", "", "")
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		r, err := waitLength(fs, *s, *m, *u, "")
		if err != nil || r.Seconds != c.seconds || r.Minutes != c.minutes {
			t.Errorf("%v: %+v %v", c.args, r, err)
		}
	}
	if got := plainHeading("icon://timer Wait: 2m 10s"); got != "Wait: 2m 10s" {
		t.Errorf("heading %q", got)
	}
}
