package scheduler

import (
	"container/heap"
	"hash/maphash"
	"sync"
	"time"

	"github.com/chime-nats/chime/timers"
)

// entry is the index's view of one active timer or waiting wait: just what
// firing needs.
type entry struct {
	key      string // <agent>.<timer> or <agent>.<wait>
	agentLen int    // key[:agentLen] is the agent ID
	wait     bool
	summary  string // the fire's text when set; the default is made at the fire, not kept
	due      int64  // unix nanoseconds the next occurrence is due: its identity
	at       int64  // unix nanoseconds of the next attempt: due, or later when retrying
	attempts int    // failed publishes of this occurrence
	occ      int64  // number of the next occurrence
	interval time.Duration
	// cal is a calendar timer's schedule (nil for the others): it says
	// each next occurrence and its jitter (see prepareCalendar).
	cal *timers.Calendar
	// fired is, for a timer, the highest occurrence this replica has
	// published, and for a wait the target it published: a record update
	// that lags behind must not re-arm what was already sent.
	fired int64
	// retry is, for a timer occurrence whose publish failed, that fire as
	// first prepared: its retry keeps the next due time chosen then, or a
	// retry whose first publish was stored after all (a lost ack) would
	// number the cadence from a later clock than the stored envelope says.
	retry *timers.TimerFired
	// awaiting says a repeating timer's next occurrence (occ, due) waits,
	// unarmed, for the previous one's publish to settle: only then is it
	// known which next due time the stored envelope states (another
	// attempt's may be stored under the same ID, see adoptStored).
	awaiting bool
	// paused is a paused wait's frozen time left; such a wait is not armed.
	paused time.Duration
	// rev is a wait's record revision, carried in its fire.
	rev   uint64
	shard int
	phase int8 // which tenth of a second a wait's progress goes out in
	pos   int  // position in its shard's heap, -1 when not armed
}

func (e *entry) agentID() string { return e.key[:e.agentLen] }
func (e *entry) itemID() string  { return e.key[e.agentLen+1:] }

// dueHeap is a min-heap of entries by the time of their next attempt.
type dueHeap []*entry

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos = i
	h[j].pos = j
}
func (h *dueHeap) Push(x any) {
	e := x.(*entry)
	e.pos = len(*h)
	*h = append(*h, e)
}
func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.pos = -1
	return e
}

// index holds the timers and waits of the shards this replica keeps and
// one heap of armed entries per shard, so the firing loop only looks at
// the shards its replica owns. It is not safe for concurrent use; the
// Scheduler guards it.
type index struct {
	entries map[string]*entry // timers by key
	waits   map[string]*entry // waits by key, kept apart for progress
	shards  []dueHeap
	// counts, when kept (the sharded layout), are each shard's active
	// records by agent, and counted is told of every change.
	counts  []map[string]*count
	counted func(shard int, agent string)
	// peaks are the tables' sizes since each was last made (see shrunk).
	entriesPeak, waitsPeak int
}

// shrinkMin is the size below which a map is never remade smaller.
const shrinkMin = 4096

// shrunk returns m, or a copy of it once it has fallen to a quarter of
// peak, its largest size since it was made, which it tracks: a Go map
// keeps the room of its largest size for good, so a burst of timers,
// once fired, would hold theirs (measured: chime-bench history). The copy
// costs O(n) once per fall to a quarter: O(1) a removal, amortized.
func shrunk[K comparable, V any](m map[K]V, peak *int) map[K]V {
	n := len(m)
	if n > *peak {
		*peak = n
	}
	if *peak < shrinkMin || n*4 > *peak {
		return m
	}
	c := make(map[K]V, n)
	for k, v := range m {
		c[k] = v
	}
	*peak = n
	return c
}

// shrink remakes the tables that have fallen to a quarter of their peak.
func (ix *index) shrink() {
	ix.entries = shrunk(ix.entries, &ix.entriesPeak)
	ix.waits = shrunk(ix.waits, &ix.waitsPeak)
}

func newIndex(shards int) *index {
	return &index{entries: make(map[string]*entry), waits: make(map[string]*entry), shards: make([]dueHeap, shards)}
}

// keepCounts makes the index count each shard's records by agent and
// tell counted of each change.
func (ix *index) keepCounts(counted func(shard int, agent string)) {
	ix.counts = make([]map[string]*count, len(ix.shards))
	for s := range ix.counts {
		ix.counts[s] = map[string]*count{}
	}
	ix.counted = counted
}

// insert adds e, not yet known, to its table.
func (ix *index) insert(e *entry) {
	ix.table(e.wait)[e.key] = e
	if e.wait {
		ix.waitsPeak = max(ix.waitsPeak, len(ix.waits))
	} else {
		ix.entriesPeak = max(ix.entriesPeak, len(ix.entries))
	}
	ix.count(e, 1)
}

// count adds d to e's agent's count in its shard.
func (ix *index) count(e *entry, d int) {
	if ix.counts == nil {
		return
	}
	agent := e.agentID()
	c := ix.counts[e.shard][agent]
	if c == nil {
		c = &count{}
		ix.counts[e.shard][agent] = c
	}
	if e.wait {
		c.Waits += d
	} else {
		c.Timers += d
	}
	if *c == (count{}) {
		delete(ix.counts[e.shard], agent)
	}
	ix.counted(e.shard, agent)
}

// countOf is the agent's count in shard.
func (ix *index) countOf(shard int, agent string) count {
	if c := ix.counts[shard][agent]; c != nil {
		return *c
	}
	return count{}
}

// agentsIn are the agents with records in shard.
func (ix *index) agentsIn(shard int) []string {
	out := make([]string, 0, len(ix.counts[shard]))
	for agent := range ix.counts[shard] {
		out = append(out, agent)
	}
	return out
}

// dropShard forgets every entry of shard s: another replica keeps it now.
func (ix *index) dropShard(s int) {
	for _, t := range []map[string]*entry{ix.entries, ix.waits} {
		for key, e := range t {
			if e.shard == s {
				delete(t, key)
			}
		}
	}
	for _, e := range ix.shards[s] {
		e.pos = -1
	}
	ix.shards[s] = nil
	if ix.counts != nil {
		ix.counts[s] = map[string]*count{} // the new owner writes them
	}
	ix.shrink()
}

// presence knows which records of one kind are active, in every shard,
// and counts them by agent, for the create quotas. It holds 8 bytes of
// hash per record rather than the record: a replica keeps whole entries
// only for its own shards, yet a create on any replica must count the
// agent's records in all of them. It has a lock of its own so that a
// create's check never waits behind the firing loop, which holds the
// scheduler's lock for a whole batch.
type presence struct {
	seed maphash.Seed
	mu   sync.RWMutex
	keys map[uint64]struct{}
	n    map[string]int // agents with none are absent
	// peaks of keys and n, for shrunk
	keysPeak, nPeak int
}

func newPresence() *presence {
	return &presence{seed: maphash.MakeSeed(), keys: make(map[uint64]struct{}), n: make(map[string]int)}
}

// set records whether the record at key, of the agent key[:agentLen],
// is active. A 64-bit hash of a random seed makes a collision among even
// ten million keys a chance of about one in 10^5 per process; one would
// make that agent's count one short until a restart.
func (p *presence) set(key string, agentLen int, active bool) {
	h := maphash.String(p.seed, key)
	p.mu.Lock()
	defer p.mu.Unlock()
	_, was := p.keys[h]
	switch {
	case active && !was:
		p.keys[h] = struct{}{}
		p.n[key[:agentLen]]++
		p.keysPeak, p.nPeak = max(p.keysPeak, len(p.keys)), max(p.nPeak, len(p.n))
	case !active && was:
		delete(p.keys, h)
		agent := key[:agentLen]
		if p.n[agent]--; p.n[agent] <= 0 {
			delete(p.n, agent)
		}
		p.keys, p.n = shrunk(p.keys, &p.keysPeak), shrunk(p.n, &p.nPeak)
	}
}

func (p *presence) get(agentID string) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.n[agentID]
}

// len is how many records are active.
func (p *presence) len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.keys)
}

// reset forgets everything: the bucket is being loaded anew.
func (p *presence) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.keys)
	clear(p.n)
}

// table is the map of timers or of waits.
func (ix *index) table(wait bool) map[string]*entry {
	if wait {
		return ix.waits
	}
	return ix.entries
}

// arm puts e in its heap at due, or moves it there.
func (ix *index) arm(e *entry) {
	h := &ix.shards[e.shard]
	if e.pos >= 0 {
		heap.Fix(h, e.pos)
		return
	}
	heap.Push(h, e)
}

// disarm takes e out of its heap; it stays known.
func (ix *index) disarm(e *entry) {
	if e.pos >= 0 {
		heap.Remove(&ix.shards[e.shard], e.pos)
	}
}

// remove forgets the timer or wait at key.
func (ix *index) remove(wait bool, key string) {
	t := ix.table(wait)
	if e, ok := t[key]; ok {
		ix.disarm(e)
		delete(t, key)
		ix.count(e, -1)
		ix.shrink()
	}
}

// next returns the earliest attempt time among owned shards.
func (ix *index) next(owned []bool) (int64, bool) {
	var best int64
	found := false
	for s, ok := range owned {
		if !ok || len(ix.shards[s]) == 0 {
			continue
		}
		if d := ix.shards[s][0].at; !found || d < best {
			best, found = d, true
		}
	}
	return best, found
}

// popDue appends to out the entries of owned shards to attempt at or before now,
// at most max of them, taking them out of their heaps.
func (ix *index) popDue(owned []bool, now int64, max int, out []*entry) []*entry {
	for s, ok := range owned {
		if !ok {
			continue
		}
		h := &ix.shards[s]
		for len(*h) > 0 && (*h)[0].at <= now && len(out) < max {
			out = append(out, heap.Pop(h).(*entry))
		}
	}
	return out
}
