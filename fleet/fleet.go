// Package fleet keeps, on every replica, a summary of every agent that
// has a record: its lifecycle state and counts of what is open (active
// timers, waits, running tasks, running monitors, open questions, unread
// notifications), for the console's fleet view. It is built from KV
// watches of the record buckets (package kvwatch), so a request reads
// memory and never scans a bucket, and it tells subscribers (the
// console's event stream) which agent changed, and in what.
//
// Memory is bounded by what is open, not by history: an open record is
// held by its key (the open questions also by their creation time, for
// the cross-agent queue), and each agent holds counters only. A finished
// record is only counted, per agent and bucket, so that an agent whose
// records are all finished is still listed; see apply for how that count
// is kept without its keys.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvwatch"
)

// Kind is a record bucket the fleet watches.
type Kind int

// The kinds, in the order of their names.
const (
	Timers Kind = iota
	Waits
	WaitFor
	Tasks
	Questions
	Notifications
	Monitors
	Agents
	numKinds
)

var kindNames = [numKinds]string{"timers", "waits", "wait_for", "tasks", "questions", "notifications", "monitors", "agents"}

// String is the kind's name, as events carry it.
func (k Kind) String() string { return kindNames[k] }

// States an agent is in, most telling first: stopped (its lifecycle),
// paused, waiting (it has a wait or WaitFor running), else active.
const (
	StateActive  = "active"
	StatePaused  = "paused"
	StateStopped = "stopped"
	StateWaiting = "waiting"
)

// States lists the states, for a filter's validation.
var States = []string{StateActive, StatePaused, StateStopped, StateWaiting}

// Counts are what an agent has open.
type Counts struct {
	Timers    int `json:"timers"`    // active timers
	Waits     int `json:"waits"`     // waiting managed waits and running WaitFors
	Tasks     int `json:"tasks"`     // running tasks
	Monitors  int `json:"monitors"`  // running monitors
	Questions int `json:"questions"` // open questions
	Unread    int `json:"unread"`    // unread notifications
}

// Agent is one agent's summary.
type Agent struct {
	AgentID string `json:"agent_id"`
	State   string `json:"state"`
	// Status is the lifecycle record's (active, stopped; empty: never
	// started), PausedAt when it is paused.
	Status   string     `json:"status,omitempty"`
	PausedAt *time.Time `json:"paused_at,omitempty"`
	Counts
	// Version orders an agent's summaries: the fleet's change sequence at
	// its last change. A page keeps the highest it has seen.
	Version uint64 `json:"version"`
}

// Change is one agent's summary after a change of one of its records.
// Gone says it has no record left.
type Change struct {
	Seq   uint64 `json:"seq"`
	Kind  string `json:"kind"`
	Agent Agent  `json:"agent"`
	Gone  bool   `json:"gone,omitempty"`
}

// agent is what the fleet holds per agent: counters.
type agent struct {
	status    string
	pausedAt  *time.Time
	lifecycle bool // it has a record in the agents bucket
	open      [numKinds]int
	// finished counts its records that are not open, per kind (see apply).
	finished [numKinds]int
	version  uint64
}

func (a *agent) empty() bool {
	if a.lifecycle {
		return false
	}
	for k := range numKinds {
		if a.open[k] > 0 || a.finished[k] > 0 {
			return false
		}
	}
	return true
}

func (a *agent) summary(id string) Agent {
	s := Agent{AgentID: id, Status: a.status, PausedAt: a.pausedAt, Version: a.version, Counts: Counts{
		Timers: a.open[Timers], Waits: a.open[Waits] + a.open[WaitFor], Tasks: a.open[Tasks],
		Monitors: a.open[Monitors], Questions: a.open[Questions], Unread: a.open[Notifications],
	}}
	s.State = a.state()
	return s
}

// state is the agent's state, most telling first.
func (a *agent) state() string {
	switch {
	case a.status == StateStopped:
		return StateStopped
	case a.pausedAt != nil:
		return StatePaused
	case a.open[Waits]+a.open[WaitFor] > 0:
		return StateWaiting
	}
	return StateActive
}

// openKey is an open record: its agent, and for a question when it was
// asked.
type openKey struct {
	agent   string
	created time.Time
}

// Buckets names the buckets the fleet watches; Timers and Waits may be
// several (the partitions of the sharded layout).
type Buckets struct {
	Timers, Waits                                              []string
	WaitFor, Tasks, Questions, Notifications, Monitors, Agents string
}

// Index is the fleet's summary. Start loads it; it is safe for concurrent
// use.
type Index struct {
	watches []*kvwatch.Watch

	mu     sync.Mutex
	agents map[string]*agent
	open   [numKinds]map[string]openKey // by record key (bucket-qualified)
	seq    uint64
	subs   map[*Sub]struct{}
}

// New returns the fleet over js's buckets; Start loads it.
func New(js jetstream.JetStream, b Buckets, log *slog.Logger) *Index {
	ix := &Index{agents: map[string]*agent{}, subs: map[*Sub]struct{}{}}
	for k := range numKinds {
		ix.open[k] = map[string]openKey{}
	}
	add := func(k Kind, bucket, keys string) {
		if bucket == "" {
			return
		}
		var w *kvwatch.Watch
		w = kvwatch.New(kvwatch.Config{
			JS: js, Bucket: bucket, Keys: keys, Log: log,
			Apply: func(e kvwatch.Entry) { ix.apply(k, bucket, e, loading(w)) },
			Reset: func() { ix.reset(k, bucket) },
		})
		ix.watches = append(ix.watches, w)
	}
	for _, name := range b.Timers {
		add(Timers, name, "")
	}
	for _, name := range b.Waits {
		add(Waits, name, "")
	}
	add(WaitFor, b.WaitFor, "rec.>")
	add(Tasks, b.Tasks, "*.*") // records, not owner keys or output chunks
	add(Questions, b.Questions, "")
	// Notifications and each agent's guid record (<agent>), whose clear
	// purges the agent's notifications from the stream: a purge is no
	// change a watch sees, the guid's is.
	add(Notifications, b.Notifications, "")
	add(Monitors, b.Monitors, "")
	add(Agents, b.Agents, "")
	return ix
}

// Start loads every bucket's records; ctx bounds only that. The watches
// run until Stop.
func (ix *Index) Start(ctx context.Context) error {
	for _, w := range ix.watches {
		if err := w.StartLoaded(ctx); err != nil {
			_ = ix.Stop(ctx)
			return errors.Join(errors.New("fleet: load"), err)
		}
	}
	return nil
}

// Stop ends the watches, and every subscription. Idempotent.
func (ix *Index) Stop(ctx context.Context) error {
	for _, w := range ix.watches {
		_ = w.Stop(ctx)
	}
	ix.mu.Lock()
	for s := range ix.subs {
		delete(ix.subs, s)
		close(s.done)
	}
	ix.mu.Unlock()
	return nil
}

// Live reports whether every watch is delivering, and if not, why.
func (ix *Index) Live() (bool, string) { return kvwatch.AllLive(ix.watches...) }

// record is the part of any record the fleet reads.
type record struct {
	AgentID   string     `json:"agent_id"`
	Status    string     `json:"status"`
	Read      bool       `json:"read"`
	PausedAt  *time.Time `json:"paused_at"`
	CreatedAt time.Time  `json:"created_at"`
}

// isOpen says whether a record of kind k counts as open.
func isOpen(k Kind, r *record) bool {
	switch k {
	case Timers, WaitFor:
		return r.Status == "active" || k == WaitFor && r.Status == "prepared"
	case Waits:
		return r.Status == "waiting"
	case Tasks, Monitors:
		return r.Status == "running"
	case Questions:
		return r.Status == "open"
	case Notifications:
		return !r.Read
	}
	return false
}

// keyAgent is the agent a key names: the agents bucket's key is the
// agent; WaitFor's rec.<agent>.<wait>; a sharded record's
// <shard>.<agent>.<id>; the others' <agent>.<id>. IDs hold no dots.
func keyAgent(k Kind, key string) string {
	parts := strings.Split(key, ".")
	switch {
	case k == Agents:
		return key
	case k == WaitFor && len(parts) == 3:
		return parts[1]
	case len(parts) == 3:
		return parts[1]
	}
	return parts[0]
}

// apply folds one change in. An open record is held by key, so its
// counters stay exact however often it changes. A finished record is
// only counted: in the load, each key's current value is seen once; after
// it, a record counts as finished when an open one ends (the usual way a
// record finishes), and stops counting when a key not held as open is
// deleted (a finished record expiring, or removed). A record that is
// written finished at once is not counted, and a key deleted twice is
// uncounted twice (never below zero): the count only keeps an agent whose
// records have all finished in the list, so being short by one costs at
// most that.
func (ix *Index) apply(k Kind, bucket string, e kvwatch.Entry, loading bool) {
	if e.Again { // a replay: this state holds it already
		return
	}
	var r record
	put := !e.Deleted && json.Unmarshal(e.Value, &r) == nil
	id := keyAgent(k, e.Key)
	if put && r.AgentID != "" {
		id = r.AgentID
	} else if put && (k == Timers || k == Waits) {
		// Timer and wait records name their agent; a value that does
		// not is no record (the buckets' layout marker).
		return
	}
	if id == "" {
		return
	}
	key := bucket + "/" + e.Key
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if k == Notifications && !strings.Contains(e.Key, ".") {
		ix.cleared(bucket, e, loading)
		return
	}
	a := ix.agents[id]
	if a == nil {
		if !put {
			return // nothing held for it
		}
		a = &agent{}
		ix.agents[id] = a
	}
	if k == Agents {
		a.lifecycle = put
		a.status, a.pausedAt = "", nil
		if put {
			a.status, a.pausedAt = r.Status, r.PausedAt
		}
	} else {
		held, wasOpen := ix.open[k][key]
		nowOpen := put && isOpen(k, &r)
		switch {
		case nowOpen && !wasOpen:
			ix.open[k][key] = openKey{agent: id, created: r.CreatedAt}
			a.open[k]++
		case nowOpen:
			held.created = r.CreatedAt
			ix.open[k][key] = held
		case wasOpen:
			delete(ix.open[k], key)
			a.open[k]--
			if put {
				a.finished[k]++
			}
		case put && loading:
			a.finished[k]++
		case !put && !loading:
			a.finished[k] = max(a.finished[k]-1, 0)
		}
	}
	gone := a.empty()
	if gone {
		delete(ix.agents, id)
	}
	// Every change is told, not only those that move a count: an agent's
	// page shows the records themselves (a timer's next fire, a
	// monitor's counts), and reads them again when told.
	after := a.summary(id)
	ix.seq++
	a.version = ix.seq
	after.Version = ix.seq
	if loading {
		return // a page reads the loaded fleet; no one follows a load
	}
	ix.publish(Change{Seq: ix.seq, Kind: k.String(), Agent: after, Gone: gone})
}

// cleared applies a change of an agent's notification guid record: with
// reset 0 it is a clear, which removed every notification of the agent
// older than it, all those held (the watch delivers in revision order).
// ix.mu is held.
func (ix *Index) cleared(bucket string, e kvwatch.Entry, loading bool) {
	var m struct {
		Reset *uint64 `json:"reset"`
	}
	if e.Deleted || json.Unmarshal(e.Value, &m) != nil || m.Reset != nil && *m.Reset != 0 {
		return
	}
	id := e.Key
	a := ix.agents[id]
	if a == nil {
		return
	}
	prefix := bucket + "/" + id + "."
	for key := range ix.open[Notifications] {
		if strings.HasPrefix(key, prefix) {
			delete(ix.open[Notifications], key)
		}
	}
	a.open[Notifications], a.finished[Notifications] = 0, 0
	gone := a.empty()
	if gone {
		delete(ix.agents, id)
	}
	ix.seq++
	a.version = ix.seq
	if !loading {
		ix.publish(Change{Seq: ix.seq, Kind: Notifications.String(), Agent: a.summary(id), Gone: gone})
	}
}

// loading says whether w is loading its bucket's current values.
func loading(w *kvwatch.Watch) bool {
	select {
	case <-w.Loaded():
		return false
	default:
		return true
	}
}

// reset forgets what one bucket held: it was deleted and is loaded anew.
func (ix *Index) reset(k Kind, bucket string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	prefix := bucket + "/"
	for key, o := range ix.open[k] {
		if strings.HasPrefix(key, prefix) {
			delete(ix.open[k], key)
			if a := ix.agents[o.agent]; a != nil {
				a.open[k]--
			}
		}
	}
	for id, a := range ix.agents {
		if k == Agents {
			a.lifecycle, a.status, a.pausedAt = false, "", nil
		}
		a.finished[k] = 0
		if a.empty() {
			delete(ix.agents, id)
		}
	}
}

// Query selects agents: State, when set, one of States; Search, when set,
// a substring of the agent ID (case-insensitive); After, when set, lists
// the agents after that ID (the previous page's last).
type Query struct {
	State, Search, After string
	Limit                int
}

// Page is a page of agents, by ID, and the fleet's totals.
type Page struct {
	Agents []Agent `json:"agents"`
	// Next is the cursor of the next page (After), empty on the last.
	Next string `json:"next_cursor,omitempty"`
	// Matched is how many agents the query selects, Total how many the
	// fleet holds; States counts the fleet's agents by state.
	Matched int            `json:"matched"`
	Total   int            `json:"total"`
	States  map[string]int `json:"states"`
	// Seq is the fleet's change sequence at the read: a change event at
	// or below it is in the page.
	Seq uint64 `json:"seq"`
}

// List reads a page. Under the lock it only selects IDs (and counts the
// states); the sort, O(n log n) in the agents selected, runs without it,
// so the watches are not held up; the page's summaries are read last.
func (ix *Index) List(q Query) Page {
	search := strings.ToLower(q.Search)
	ix.mu.Lock()
	p := Page{Total: len(ix.agents), States: map[string]int{}, Seq: ix.seq}
	sel := make([]string, 0, len(ix.agents))
	for id, a := range ix.agents {
		st := a.state()
		p.States[st]++
		if q.State != "" && st != q.State || search != "" && !strings.Contains(strings.ToLower(id), search) {
			continue
		}
		sel = append(sel, id)
	}
	ix.mu.Unlock()
	p.Matched = len(sel)
	slices.Sort(sel)
	start := 0
	if q.After != "" {
		start, _ = slices.BinarySearch(sel, q.After)
		if start < len(sel) && sel[start] == q.After {
			start++
		}
	}
	end := min(start+q.Limit, len(sel))
	p.Agents = make([]Agent, 0, end-start)
	ix.mu.Lock()
	for _, id := range sel[start:end] {
		if a := ix.agents[id]; a != nil { // not gone since
			p.Agents = append(p.Agents, a.summary(id))
		}
	}
	ix.mu.Unlock()
	if end < len(sel) && end > start {
		p.Next = sel[end-1]
	}
	return p
}

// Seq is the fleet's change sequence: the last change's.
func (ix *Index) Seq() uint64 {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.seq
}

// OpenQuestion names an open question: its agent and ID, and when it
// was asked.
type OpenQuestion struct {
	AgentID, ID string
	CreatedAt   time.Time
}

// OpenQuestions lists open questions across agents, oldest first (the
// longest waiting on an operator), after the cursor (the previous page's
// last, its creation time and key), at most limit, and whether more
// follow; total is how many are open.
func (ix *Index) OpenQuestions(after *OpenQuestion, limit int) (page []OpenQuestion, more bool, total int) {
	ix.mu.Lock()
	all := make([]OpenQuestion, 0, len(ix.open[Questions]))
	for key, o := range ix.open[Questions] {
		_, k, _ := strings.Cut(key, "/")
		_, qid, _ := strings.Cut(k, ".")
		all = append(all, OpenQuestion{AgentID: o.agent, ID: qid, CreatedAt: o.created})
	}
	ix.mu.Unlock()
	cmp := func(a, b OpenQuestion) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		if c := strings.Compare(a.AgentID, b.AgentID); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	}
	slices.SortFunc(all, cmp)
	start := 0
	if after != nil {
		start, _ = slices.BinarySearchFunc(all, *after, func(q, a OpenQuestion) int {
			if cmp(q, a) <= 0 {
				return -1
			}
			return 1
		})
	}
	end := min(start+limit, len(all))
	return all[start:end], end < len(all), len(all)
}

// Sub is one subscriber's changes: C carries them, in order, up to its
// buffer; Lost says some were dropped since the last call (the buffer
// was full), and the subscriber should read the whole view again. Done is
// closed when the fleet stops.
type Sub struct {
	C    chan Change
	Wake chan struct{}
	done chan struct{}
	lost atomic.Bool
}

// Done is closed when the fleet stops.
func (s *Sub) Done() <-chan struct{} { return s.done }

// Lost reports, and clears, that changes were dropped.
func (s *Sub) Lost() bool { return s.lost.Swap(false) }

// ErrTooMany refuses a subscription beyond the fleet's limit.
var ErrTooMany = errors.New("fleet: too many subscribers")

// Subscribe follows the fleet's changes with a buffer of n, while fewer
// than most subscribe; cancel ends it.
func (ix *Index) Subscribe(n, most int) (s *Sub, cancel func(), err error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if len(ix.subs) >= most {
		return nil, nil, ErrTooMany
	}
	s = &Sub{C: make(chan Change, n), Wake: make(chan struct{}, 1), done: make(chan struct{})}
	ix.subs[s] = struct{}{}
	return s, func() {
		ix.mu.Lock()
		defer ix.mu.Unlock()
		if _, ok := ix.subs[s]; ok {
			delete(ix.subs, s)
			close(s.done)
		}
	}, nil
}

// Subscribers is how many follow the fleet.
func (ix *Index) Subscribers() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(ix.subs)
}

// publish offers c to every subscriber without waiting: a full buffer
// marks the subscriber as having lost changes, so a slow page never holds
// the watches up. ix.mu is held.
func (ix *Index) publish(c Change) {
	for s := range ix.subs {
		select {
		case s.C <- c:
		default:
			s.lost.Store(true)
			select {
			case s.Wake <- struct{}{}:
			default:
			}
		}
	}
}
