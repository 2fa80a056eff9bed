// Package pacer owns the pacing of log lines about what others cause: a
// flood of refused requests, permission violations or records passed over
// must not flood the log, so each kind is one line per interval, with how
// many happened since the last.
package pacer

import (
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Pacer paces one kind of log line.
type Pacer struct {
	sometimes rate.Sometimes
	unlogged  atomic.Int64
}

// New returns a Pacer that lets a line through at most once per interval.
func New(interval time.Duration) *Pacer {
	return &Pacer{sometimes: rate.Sometimes{Interval: interval}}
}

// Do counts n more events and, when the interval allows, calls log with
// how many there were since its last call (these n included).
func (p *Pacer) Do(n int64, log func(count int64)) {
	count := p.unlogged.Add(n)
	p.sometimes.Do(func() {
		p.unlogged.Add(-count)
		log(count)
	})
}
