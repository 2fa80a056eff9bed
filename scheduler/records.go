package scheduler

import (
	"context"
	"sync"

	"github.com/chime-nats/chime/subjects"
)

// recordQueue holds delivered occurrences whose record update is still to
// be written. It never blocks the ack loop: a burst settles at the rate
// the inbox acks it, not at the rate records can be written (two KV round
// trips each), and what it holds is bounded by the fires in the burst.
type recordQueue struct {
	mu    sync.Mutex
	items []subjects.TimerFired
	head  int
	ready chan struct{} // one token while items is non-empty
}

func newRecordQueue() *recordQueue {
	return &recordQueue{ready: make(chan struct{}, 1)}
}

func (q *recordQueue) push(f subjects.TimerFired) {
	q.mu.Lock()
	q.items = append(q.items, f)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop returns the oldest occurrence, waiting for one; ok is false once ctx
// is done.
func (q *recordQueue) pop(ctx context.Context) (f subjects.TimerFired, ok bool) {
	for {
		q.mu.Lock()
		if q.head < len(q.items) {
			f = q.items[q.head]
			q.items[q.head] = subjects.TimerFired{} // let the strings go
			q.head++
			if q.head == len(q.items) {
				q.items, q.head = q.items[:0], 0
				if cap(q.items) > shrinkMin {
					q.items = nil // a burst's array is not kept once drained
				}
			} else if q.head > 1024 && q.head*2 > len(q.items) {
				// Compact, so a long-lived queue does not keep a burst's
				// backing array ahead of its head.
				n := copy(q.items, q.items[q.head:])
				clear(q.items[n:])
				q.items, q.head = q.items[:n], 0
			}
			more := q.head < len(q.items)
			q.mu.Unlock()
			if more {
				select {
				case q.ready <- struct{}{}: // wake the next worker
				default:
				}
			}
			return f, true
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return f, false
		case <-q.ready:
		}
	}
}

// len is how many updates wait.
func (q *recordQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) - q.head
}
