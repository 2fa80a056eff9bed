package scheduler

import (
	"context"
	"sync"

	"github.com/chime-nats/chime/timers"
)

// recordQueue holds delivered occurrences whose record update is still to
// be written. It never blocks the ack loop: a burst settles at the rate
// the inbox acks it, not at the rate records can be written (two KV round
// trips each), and what it holds is bounded by the fires in the burst.
//
// It is a list of fixed-size chunks, not one growing slice: a burst's
// appends then never copy what is queued (growing a slice of 50k fires
// cost the ack loop a tenth of a burst's CPU, chime-bench timers
// --fire-cpuprofile), and each chunk goes once drained, so the queue does
// not keep a burst's room.
type recordQueue struct {
	mu         sync.Mutex
	head, tail *recordChunk // head pops, tail pushes; nil when empty
	n          int
	ready      chan struct{} // one token while the queue is non-empty
}

// recordChunkSize is how many occurrences a chunk holds (about 28 KiB).
const recordChunkSize = 256

type recordChunk struct {
	items [recordChunkSize]timers.TimerFired
	r, w  int // next to pop, next to push
	next  *recordChunk
}

func newRecordQueue() *recordQueue {
	return &recordQueue{ready: make(chan struct{}, 1)}
}

func (q *recordQueue) push(f timers.TimerFired) {
	q.mu.Lock()
	if q.tail == nil || q.tail.w == recordChunkSize {
		c := &recordChunk{}
		if q.tail == nil {
			q.head = c
		} else {
			q.tail.next = c
		}
		q.tail = c
	}
	q.tail.items[q.tail.w] = f
	q.tail.w++
	q.n++
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop returns the oldest occurrence, waiting for one; ok is false once ctx
// is done.
func (q *recordQueue) pop(ctx context.Context) (f timers.TimerFired, ok bool) {
	for {
		q.mu.Lock()
		if q.n > 0 {
			c := q.head
			f = c.items[c.r]
			c.items[c.r] = timers.TimerFired{} // let the strings go
			c.r++
			q.n--
			switch {
			case q.n == 0 && c.w < recordChunkSize:
				c.r, c.w = 0, 0 // the only chunk, and room left: reuse it
			case c.r == recordChunkSize:
				q.head = c.next
				if q.head == nil {
					q.tail = nil
				}
			}
			more := q.n > 0
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
	return q.n
}
