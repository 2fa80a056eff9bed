package testwait

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// fake records a failure instead of ending the test.
type fake struct {
	testing.TB
	failed string
}

func (f *fake) Helper()                        {}
func (f *fake) Fatalf(format string, a ...any) { f.failed = fmt.Sprintf(format, a...) }

func TestEventuallyWaitsForTheState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		ready := start.Add(300 * time.Millisecond)
		var f fake
		Eventually(&f, time.Second, func() bool { return !time.Now().Before(ready) })
		if f.failed != "" {
			t.Fatal(f.failed)
		}
		if late := time.Since(ready); late < 0 || late > poll {
			t.Fatalf("returned %v after the state", late)
		}
	})
}

func TestUntilFailsWithTheLastReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var f fake
		n := 0
		Until(&f, time.Second, func() (bool, string) { n++; return false, fmt.Sprint("try ", n) }, "shard %d owned", 3)
		if time.Since(start) != time.Second {
			t.Errorf("gave up after %v", time.Since(start))
		}
		if want := fmt.Sprintf("shard 3 owned: not within 1s; last: try %d", n); f.failed != want || !strings.Contains(f.failed, "try") {
			t.Errorf("failure %q, want %q", f.failed, want)
		}
	})
}
