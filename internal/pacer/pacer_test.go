package pacer_test

import (
	"slices"
	"testing"
	"time"

	"github.com/chime-nats/chime/internal/pacer"
)

// TestPacer: the first event is a line; what follows within the interval
// is counted into the next line.
func TestPacer(t *testing.T) {
	const interval = 50 * time.Millisecond
	p := pacer.New(interval)
	var lines []int64
	logLine := func(n int64) { lines = append(lines, n) }
	p.Do(1, logLine)
	for range 4 {
		p.Do(2, logLine)
	}
	time.Sleep(interval + 10*time.Millisecond)
	p.Do(1, logLine)
	if !slices.Equal(lines, []int64{1, 9}) {
		t.Fatalf("lines %v, want [1 9]", lines)
	}
}
