package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// InboxOptions configures an inbox run: one chime replica (a child
// process) on a nats-server of its own, Agents agents each given one
// timer due shortly, each reading its inbox reliably (inbox.fetch, then
// inbox.ack) as its delivery comes, the nats-server SIGKILLed and
// restarted on its store midway, then every inbox checked.
type InboxOptions struct {
	Agents   int           // agents, one timer each
	InFlight int           // requests in flight (creates, then fetches and acks)
	Conns    int           // bench connections the requests are spread over
	Lead     time.Duration // every timer is due this long after the first create; 0: 5 s plus 0.3 ms per agent (more than the creates take)
	Max      int           // a fetch's max
	Timeout  time.Duration // one request's time out (a request lost in the kill is sent again after it)
	Restart  bool          // SIGKILL and restart the nats-server when half the agents have read their delivery
	Exe      string        // the chime binary run as `serve`; default chime beside this binary, else on PATH
	Keep     bool          // keep the work dir (store, logs); kept anyway when the run fails
	// ProfileDir, when set, receives a CPU profile of the replica
	// (CHIME_PPROF_ADDR) of ProfileSeconds from the due time.
	ProfileDir     string
	ProfileSeconds int
	Progress       io.Writer // a line per phase; nil: none
}

// Validate checks the options.
func (o *InboxOptions) Validate() error {
	switch {
	case o.Agents <= 0:
		return errors.New("bench: --agents must be positive")
	case o.InFlight <= 0:
		return errors.New("bench: -c must be positive")
	case o.Conns <= 0:
		return errors.New("bench: --conns must be positive")
	case o.Lead < 0:
		return errors.New("bench: --lead must not be negative")
	case o.Timeout <= 0:
		return errors.New("bench: --timeout must be positive")
	case o.ProfileDir != "" && o.ProfileSeconds < 1:
		return errors.New("bench: --profile-seconds must be at least 1")
	case o.Max < 1 || o.Max > deliveries.MaxInboxFetch:
		return fmt.Errorf("bench: --max must be from 1 to %d", deliveries.MaxInboxFetch)
	}
	return nil
}

// InboxResult is what an inbox run measured.
type InboxResult struct {
	Agents   int   `json:"agents"`
	InFlight int   `json:"in_flight"`
	Conns    int   `json:"conns"`
	LeadMs   int64 `json:"lead_ms"`
	// LeadMarginMs is the due time minus the end of the creates: negative
	// when the creates overran it (the late ones fired at once).
	LeadMarginMs float64 `json:"lead_margin_ms"`
	Max          int     `json:"max"`
	TimeoutMs    int64   `json:"request_timeout_ms"`

	CreatesPerS   float64 `json:"creates_per_s"`
	CreateRetries int     `json:"create_retries"`
	// ReadS is from the first create until every agent has read and acked
	// its delivery (or the give-up).
	ReadS float64 `json:"read_s"`

	// Delivered is agents whose delivery was read; Lost those whose inbox
	// held none at the check (never delivered, or gone); Repeated deliveries
	// returned again after their ack was confirmed, or stored twice;
	// Redelivered returned again because their ack failed (the reliable
	// read's at-least-once, not an error); Unexpected deliveries not the
	// agent's timer's.
	Delivered   int `json:"delivered"`
	Lost        int `json:"lost"`
	Repeated    int `json:"repeated"`
	Redelivered int `json:"redelivered"`
	Unexpected  int `json:"unexpected"`
	// Late is agents whose delivery the check found that the readers had
	// not read when they gave up (inboxStall without a read).
	Late int `json:"late"`
	// Verified is agents whose check (a fetch from the start of their
	// inbox) found exactly their one delivery, their cursor on it.
	Verified int `json:"verified"`

	Fetches     int     `json:"fetches"`
	EmptyFetch  int     `json:"empty_fetches"`
	FetchErrors int     `json:"fetch_errors"`
	AckErrors   int     `json:"ack_errors"`
	FetchMs     Latency `json:"fetch_ms"`
	AckMs       Latency `json:"ack_ms"`

	Restart *InboxRestart `json:"restart,omitempty"`
	Cold    *InboxCold    `json:"cold,omitempty"`

	// CPU is each process's CPU seconds from the due time until every
	// agent has read (the restart included): the replica, the nats-server,
	// the bench, and the machine (every process on it).
	CPU []InboxCPU `json:"cpu"`

	// Memory (VmRSS) of the nats-server and the replica: with the fleet up
	// and no agent yet, and at the end (every agent read and checked; the
	// server's after its restart).
	ServerIdleRSS  int64   `json:"server_idle_rss_bytes"`
	ServerRSS      int64   `json:"server_rss_bytes"`
	ChimeIdleRSS   int64   `json:"chime_idle_rss_bytes"`
	ChimeRSS       int64   `json:"chime_rss_bytes"`
	ServerPerAgent float64 `json:"server_rss_per_agent_bytes"`
	ChimePerAgent  float64 `json:"chime_rss_per_agent_bytes"`
	// AgentsBucketBytes and InboxBytes are what chime_agents and
	// CHIME_INBOX store at the end.
	AgentsBucketBytes uint64 `json:"agents_bucket_bytes"`
	InboxBytes        uint64 `json:"inbox_bytes"`
}

// InboxRestart is the nats-server's SIGKILL and restart on its store.
type InboxRestart struct {
	AtRead int `json:"at_read"` // agents done when it was killed
	// Times from the SIGKILL: the server accepting connections again, a
	// probe's fetch (sent every 10 ms, each given 250 ms) answered, and
	// every agent's delivery read and acked (requests lost in the kill
	// are sent again after their time out).
	ServerUpMs   float64 `json:"server_up_ms"`
	FirstFetchMs float64 `json:"first_fetch_ms"`
	AllReadMs    float64 `json:"all_read_ms"`
	// ServerRSSBefore is the server's RSS just before the kill.
	ServerRSSBefore int64 `json:"server_rss_before_bytes"`
}

// InboxCPU is one process's CPU seconds in the read phase.
type InboxCPU struct {
	Name  string  `json:"name"` // r1 (the replica), standalone (the nats-server), bench, machine
	ReadS float64 `json:"read_s"`
}

// InboxCold is the nats-server SIGKILLed and restarted once more at the
// end, idle: its start on the store every agent has written, and its
// memory then.
type InboxCold struct {
	ServerUpMs     float64 `json:"server_up_ms"`
	FirstFetchMs   float64 `json:"first_fetch_ms"`
	ServerRSS      int64   `json:"server_rss_bytes"`
	ServerPerAgent float64 `json:"server_rss_per_agent_bytes"`
}

// Err fails a run that lost or repeated a delivery.
func (r *InboxResult) Err() error {
	if r.Lost > 0 || r.Repeated > 0 || r.Unexpected > 0 || r.Verified != r.Agents {
		return fmt.Errorf("bench: inbox: %d lost, %d repeated, %d unexpected, %d not read in time, %d of %d verified", r.Lost, r.Repeated, r.Unexpected, r.Late, r.Verified, r.Agents)
	}
	return nil
}

// The inbox run's fixed shape.
const (
	inboxRequest  = 5 * time.Second        // one request outside the reads (creates, the check)
	inboxProbe    = 250 * time.Millisecond // a probe fetch's time out
	inboxSweep    = 200 * time.Millisecond // how often the agents are looked at for a read without a hint
	inboxPollMin  = 100 * time.Millisecond // an agent found empty is read again after this without a hint,
	inboxPollMax  = 5 * time.Second        // doubling up to this
	inboxStall    = time.Minute            // given up when no agent has read for this long
	inboxSettle   = 3 * time.Second        // before memory is read
	inboxKillWait = 50 * time.Millisecond  // how often the read count is looked at for the kill
	inboxRetry    = 100 * time.Millisecond // between retries of a create
)

// inboxAgent is one agent's reader state.
type inboxAgent struct {
	queued atomic.Bool  // in the fetch queue
	due    atomic.Int64 // unix nanos of its due time; 0 until created
	// next is when the sweep reads it without a hint (unix nanos), and
	// poll the wait after that one, doubling while its inbox is empty.
	next  atomic.Int64
	poll  time.Duration // under mu
	mu    sync.Mutex    // one fetch at a time
	want  string        // its timer's envelope ID
	seq   uint64        // its delivery's sequence, once read
	acked uint64        // its cursor as the last confirmed ack said
	done  bool
}

// inboxRun is one run's shared state.
type inboxRun struct {
	o       InboxOptions
	prefix  string
	agents  []inboxAgent
	conns   []*nats.Conn
	probe   *nats.Conn // the restart's probe, on a connection of its own
	queue   chan int
	dueAt   time.Time // every timer's due time
	done    atomic.Int64
	allDone chan struct{}
	killAt  atomic.Int64 // unix nanos; 0: no kill yet
	cpuKill []procTime   // CPU times just before the kill; set before killAt

	mu                                           sync.Mutex
	fetchLat, ackLat                             []time.Duration
	fetches, empty, fetchErrs, ackErrs           int
	delivered, repeated, redelivered, unexpected int
	createRetries                                int
}

// Inbox runs the inbox benchmark.
func Inbox(ctx context.Context, o InboxOptions) (res *InboxResult, err error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Exe, err = ownExe(o.Exe); err != nil {
		return nil, err
	}
	if o.ProfileDir != "" {
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			return nil, fmt.Errorf("bench: --profile: %w", err)
		}
	}
	if o.Lead == 0 {
		o.Lead = 5*time.Second + time.Duration(o.Agents)*300*time.Microsecond
	}
	progress := progressf(o.Progress, "inbox")
	f, err := startFleet(ctx, fleetOptions{
		servers: 1, replicas: 1, exe: o.Exe, progress: progress, pprof: o.ProfileDir != "",
		env: []string{"CHIME_CREATE_RATE=0", "CHIME_MAX_TIMERS_PER_AGENT=0"},
	})
	if err != nil {
		return nil, err
	}
	defer func() { f.close(o.Keep || err != nil || (res != nil && res.Err() != nil)) }()
	server, replica := f.servers[0], f.replicas[0]
	res = &InboxResult{Agents: o.Agents, InFlight: o.InFlight, Conns: o.Conns, LeadMs: o.Lead.Milliseconds(), Max: o.Max, TimeoutMs: o.Timeout.Milliseconds()}
	res.ServerIdleRSS, res.ChimeIdleRSS = settledRSS(ctx, server.Pid()), settledRSS(ctx, replica.pid())

	r := &inboxRun{
		o: o, prefix: fmt.Sprintf("ib%d", time.Now().UnixNano()%1e6), agents: make([]inboxAgent, o.Agents),
		queue: make(chan int, o.Agents), allDone: make(chan struct{}),
	}
	var closeConns func()
	if r.conns, closeConns, err = inboxConnect(f.urls(), o.Conns+1); err != nil {
		return nil, err
	}
	defer closeConns()
	r.conns, r.probe = r.conns[:o.Conns], r.conns[o.Conns]
	// The live path as a hint: a delivery published wakes its agent's
	// reliable read. One subscription for all the agents (NATS
	// authorization is off); the sweep reads those whose hint was lost.
	hint, err := r.conns[0].Subscribe(subjects.AgentWildcard(subjects.ActionInbox), func(m *nats.Msg) {
		if i, ok := r.index(m.Subject); ok {
			r.enqueue(i)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("bench: subscribe: %w", err)
	}
	hint.SetPendingLimits(-1, -1)
	if err := r.conns[0].Flush(); err != nil {
		return nil, fmt.Errorf("bench: flush: %w", err)
	}

	rctx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	var readers errgroup.Group
	for w := range o.InFlight {
		readers.Go(func() error { r.read(rctx, r.conns[w%len(r.conns)]); return nil })
	}
	readers.Go(func() error { r.sweep(rctx); return nil })

	progress("%d agents: creating one timer each, all due in %v, %d requests in flight over %d connections", o.Agents, o.Lead, o.InFlight, o.Conns)
	start := time.Now()
	r.dueAt = start.Add(o.Lead)
	var restart errgroup.Group
	if o.Restart {
		restart.Go(func() error {
			var err error
			res.Restart, err = r.restartMidway(rctx, f, progress)
			return err
		})
	}
	if err := r.create(ctx); err != nil {
		return nil, err
	}
	res.CreatesPerS = float64(o.Agents) / time.Since(start).Seconds()
	res.LeadMarginMs = ms(time.Until(r.dueAt))
	progress("%.0f creates/s; due in %v; reading", res.CreatesPerS, time.Until(r.dueAt).Round(time.Millisecond))

	profiles := f.profiler(ctx, o.ProfileDir, o.ProfileSeconds, "inbox")
	defer func() {
		if perr := profiles.wait(); err == nil && perr != nil {
			err = perr
		}
	}()
	if !backoff.Sleep(ctx, time.Until(r.dueAt)) {
		return nil, ctx.Err()
	}
	profiles.start("read")
	cpu0 := f.cpu()
	if err := r.waitRead(ctx, progress); err != nil {
		return nil, err
	}
	end := time.Now()
	cpu1 := f.cpu()
	res.ReadS = end.Sub(start).Seconds()
	stopReaders()
	_ = readers.Wait()
	if err := restart.Wait(); err != nil {
		return nil, err
	}
	for _, p := range cpu0 {
		c := InboxCPU{Name: p.name, ReadS: cpuDelta(cpu0, cpu1, p.name)}
		if p.name == server.Name() && r.cpuKill != nil {
			// Two processes: the killed one's until the kill, and all of
			// the restarted one's (its recovery included).
			c.ReadS = cpuDelta(cpu0, r.cpuKill, p.name)
			for _, q := range cpu1 {
				if q.name == p.name {
					c.ReadS += q.cpu.Seconds()
				}
			}
		}
		res.CPU = append(res.CPU, c)
	}
	if res.Restart != nil {
		kill := time.Unix(0, r.killAt.Load())
		if r.done.Load() == int64(o.Agents) {
			res.Restart.AllReadMs = ms(end.Sub(kill))
		}
	}

	progress("%d of %d read in %.1f s; checking every inbox from its start", r.done.Load(), o.Agents, res.ReadS)
	if res.Verified, err = r.check(ctx, res); err != nil {
		return nil, err
	}
	res.ServerRSS, res.ChimeRSS = settledRSS(ctx, server.Pid()), settledRSS(ctx, replica.pid())
	res.ServerPerAgent = float64(res.ServerRSS-res.ServerIdleRSS) / float64(o.Agents)
	res.ChimePerAgent = float64(res.ChimeRSS-res.ChimeIdleRSS) / float64(o.Agents)
	if o.Restart {
		// Once more, idle: the server's start on the store every agent has
		// written, and its memory then (no write caches, no garbage).
		progress("SIGKILLing the nats-server once more, idle, and restarting it")
		cold := &InboxCold{}
		if cold.ServerUpMs, cold.FirstFetchMs, err = r.restart(ctx, server, nil); err != nil {
			return nil, err
		}
		cold.ServerRSS = settledRSS(ctx, server.Pid())
		cold.ServerPerAgent = float64(cold.ServerRSS-res.ServerIdleRSS) / float64(o.Agents)
		res.Cold = cold
	}
	res.AgentsBucketBytes, res.InboxBytes = streamBytes(ctx, r.conns[0], "KV_chime_agents"), streamBytes(ctx, r.conns[0], "CHIME_INBOX")

	r.mu.Lock()
	defer r.mu.Unlock()
	res.CreateRetries = r.createRetries
	res.Fetches, res.EmptyFetch, res.FetchErrors, res.AckErrors = r.fetches, r.empty, r.fetchErrs, r.ackErrs
	res.FetchMs, res.AckMs = summarize(r.fetchLat), summarize(r.ackLat)
	res.Delivered, res.Repeated, res.Redelivered, res.Unexpected = r.delivered, res.Repeated+r.repeated, r.redelivered, r.unexpected
	return res, nil
}

// waitRead waits until every agent has read, or none has for inboxStall.
func (r *inboxRun) waitRead(ctx context.Context, progress func(string, ...any)) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last, since := r.done.Load(), time.Now()
	for {
		select {
		case <-r.allDone:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if n := r.done.Load(); n != last {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) > inboxStall {
			progress("gave up with %d of %d read: none for %v", last, len(r.agents), inboxStall)
			return nil
		}
	}
}

// agent is agent i's ID.
func (r *inboxRun) agent(i int) string { return r.prefix + "-" + strconv.Itoa(i) }

// index is the agent of an inbox subject, if it is one of this run's.
func (r *inboxRun) index(subject string) (int, bool) {
	id, ok := strings.CutPrefix(subject, "agent."+r.prefix+"-")
	if !ok {
		return 0, false
	}
	id, ok = strings.CutSuffix(id, ".inbox")
	i, err := strconv.Atoi(id)
	if !ok || err != nil || i < 0 || i >= len(r.agents) {
		return 0, false
	}
	return i, true
}

// enqueue queues agent i's read once.
func (r *inboxRun) enqueue(i int) {
	if r.agents[i].queued.CompareAndSwap(false, true) {
		r.queue <- i
	}
}

// sweep queues, every inboxSweep, the agents not done whose next read
// without a hint has come (from their due time on, then backing off while
// they find nothing): a hint lost (the server restarting), or a delivery
// not yet stored when its hint's fetch ran.
func (r *inboxRun) sweep(ctx context.Context) {
	t := time.NewTicker(inboxSweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for i := range r.agents {
				a := &r.agents[i]
				if next := a.next.Load(); next != 0 && next < now.UnixNano() && !r.isDone(a) {
					r.enqueue(i)
				}
			}
		}
	}
}

func (r *inboxRun) isDone(a *inboxAgent) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.done
}

// create creates each agent's timer, retried (by request_id, so a retry
// never makes a second) until it is answered.
func (r *inboxRun) create(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	for c := range r.o.InFlight {
		nc := r.conns[c%len(r.conns)]
		g.Go(func() error {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(r.agents) {
					return nil
				}
				// One body for every attempt: a retry with another would
				// conflict with the create its request_id already made.
				sent := time.Now()
				duration := max(r.dueAt.Sub(sent), time.Millisecond)
				body := []byte(`{"duration_ms":` + strconv.FormatInt(duration.Milliseconds(), 10) + `,"request_id":"bench"}`)
				for {
					rctx, cancel := context.WithTimeout(gctx, inboxRequest)
					msg, err := nc.RequestWithContext(rctx, subjects.Agent(r.agent(i), subjects.ActionTimerCreate), body)
					cancel()
					var t timers.Timer
					if err == nil {
						err = subjects.DecodeReply(msg.Data, &t)
					}
					if err == nil {
						a := &r.agents[i]
						a.mu.Lock()
						a.want = (&timers.TimerFired{TimerID: t.ID, Occurrence: 1}).EnvelopeID()
						a.mu.Unlock()
						a.due.Store(sent.Add(duration).UnixNano())
						a.next.Store(sent.Add(duration).UnixNano())
						break
					}
					if gctx.Err() != nil {
						return gctx.Err()
					}
					r.mu.Lock()
					r.createRetries++
					r.mu.Unlock()
					if !backoff.Sleep(gctx, inboxRetry) {
						return gctx.Err()
					}
				}
			}
		})
	}
	return g.Wait()
}

// read is one reader: it takes queued agents and reads each one's inbox
// reliably, fetch then ack.
func (r *inboxRun) read(ctx context.Context, nc *nats.Conn) {
	for {
		select {
		case <-ctx.Done():
			return
		case i := <-r.queue:
			r.agents[i].queued.Store(false)
			r.readOne(ctx, nc, i)
		}
	}
}

func (r *inboxRun) readOne(ctx context.Context, nc *nats.Conn, i int) {
	a := &r.agents[i]
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done || a.want == "" {
		return
	}
	var reply deliveries.InboxFetchReply
	started := time.Now()
	if err := r.request(ctx, nc, subjects.Agent(r.agent(i), deliveries.ActionInboxFetch), []byte(`{"max":`+strconv.Itoa(r.o.Max)+`}`), &reply); err != nil {
		r.count(func() { r.fetchErrs++ })
		return
	}
	took := time.Since(started)
	r.count(func() {
		r.fetches++
		r.fetchLat = append(r.fetchLat, took)
		if len(reply.Deliveries) == 0 {
			r.empty++
		}
	})
	// An ack whose reply was lost may have moved the cursor all the same.
	a.acked = max(a.acked, reply.Acked)
	if len(reply.Deliveries) == 0 {
		r.finish(a)
		a.poll = min(max(2*a.poll, inboxPollMin), inboxPollMax)
		a.next.Store(time.Now().Add(a.poll).UnixNano())
		return
	}
	a.poll = 0
	a.next.Store(time.Now().Add(inboxPollMin).UnixNano()) // until its ack is confirmed
	last := uint64(0)
	for _, d := range reply.Deliveries {
		last = d.Seq
		var env subjects.Envelope
		switch {
		case json.Unmarshal(d.Envelope, &env) != nil || env.ID != a.want || env.AgentID != r.agent(i):
			r.count(func() { r.unexpected++ })
		case a.seq == 0:
			a.seq = d.Seq
			r.count(func() { r.delivered++ })
		case d.Seq != a.seq: // the same envelope stored twice
			r.count(func() { r.repeated++ })
		case a.acked >= d.Seq: // returned again after a confirmed ack
			r.count(func() { r.repeated++ })
		default: // its ack was not confirmed: at least once
			r.count(func() { r.redelivered++ })
		}
	}
	var acked deliveries.InboxAckReply
	started = time.Now()
	if err := r.request(ctx, nc, subjects.Agent(r.agent(i), deliveries.ActionInboxAck), []byte(`{"seq":`+strconv.FormatUint(last, 10)+`}`), &acked); err != nil {
		r.count(func() { r.ackErrs++ })
		return
	}
	took = time.Since(started)
	r.count(func() { r.ackLat = append(r.ackLat, took) })
	a.acked = max(a.acked, acked.Acked)
	r.finish(a)
}

// finish marks a done once its delivery is read and acked; a.mu is held.
func (r *inboxRun) finish(a *inboxAgent) {
	if a.done || a.seq == 0 || a.acked < a.seq {
		return
	}
	a.done = true
	if r.done.Add(1) == int64(len(r.agents)) {
		close(r.allDone)
	}
}

func (r *inboxRun) count(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
}

// request sends one request and decodes its reply (an error reply is an
// error).
func (r *inboxRun) request(ctx context.Context, nc *nats.Conn, subject string, body []byte, v any) error {
	return requestWithin(ctx, r.o.Timeout, nc, subject, body, v)
}

func requestWithin(ctx context.Context, timeout time.Duration, nc *nats.Conn, subject string, body []byte, v any) error {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, subject, body)
	if err != nil {
		return err
	}
	return subjects.DecodeReply(msg.Data, v)
}

// restartMidway SIGKILLs the nats-server once half the agents are done,
// and restarts it on its store at once.
func (r *inboxRun) restartMidway(ctx context.Context, f *fleet, progress func(string, ...any)) (*InboxRestart, error) {
	half := int64(len(r.agents) / 2)
	for r.done.Load() < half {
		if !backoff.Sleep(ctx, inboxKillWait) {
			return nil, nil // the run ended first
		}
	}
	s := f.servers[0]
	out := &InboxRestart{AtRead: int(r.done.Load())}
	out.ServerRSSBefore, _ = procMemory(s.Pid())
	progress("SIGKILLing the nats-server with %d of %d read, and restarting it on its store", out.AtRead, len(r.agents))
	var err error
	r.cpuKill = f.cpu()
	if out.ServerUpMs, out.FirstFetchMs, err = r.restart(ctx, s, func(kill time.Time) { r.killAt.Store(kill.UnixNano()) }); err != nil {
		return nil, err
	}
	progress("nats-server accepting connections %.0f ms after the kill, a fetch answered after %.0f ms", out.ServerUpMs, out.FirstFetchMs)
	return out, nil
}

// restart SIGKILLs the nats-server (calling killed with the time) and
// starts it again on its store, and returns how long after the kill it
// accepted connections and a probe's fetch (one every 10 ms, each given
// 250 ms) was answered: chime serving reads again, whatever requests the
// kill lost.
func (r *inboxRun) restart(ctx context.Context, s *natsproc.Server, killed func(time.Time)) (upMs, fetchMs float64, err error) {
	kill := time.Now()
	if killed != nil {
		killed(kill)
	}
	if err := s.Kill(); err != nil {
		return 0, 0, fmt.Errorf("bench: kill the nats-server: %w", err)
	}
	probe := make(chan time.Time, 1) // never blocks the probe
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for pctx.Err() == nil {
			var reply deliveries.InboxFetchReply
			if err := requestWithin(pctx, inboxProbe, r.probe, subjects.Agent(r.agent(0), deliveries.ActionInboxFetch), nil, &reply); err == nil {
				probe <- time.Now()
				return
			}
			backoff.Sleep(pctx, 10*time.Millisecond)
		}
	}()
	if err := s.Start(); err != nil {
		return 0, 0, fmt.Errorf("bench: restart the nats-server: %w", err)
	}
	upMs = ms(time.Since(kill))
	select {
	case at := <-probe:
		return upMs, ms(at.Sub(kill)), nil
	case <-ctx.Done(): // the run ended first
		return upMs, 0, nil
	}
}

// check fetches each agent's inbox from its start: exactly its one
// delivery, and its cursor on it. A missing one is lost, more than one
// repeated (res).
func (r *inboxRun) check(ctx context.Context, res *InboxResult) (int, error) {
	g, gctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	var mu sync.Mutex
	verified := 0
	for c := range r.o.InFlight {
		nc := r.conns[c%len(r.conns)]
		g.Go(func() error {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(r.agents) {
					return nil
				}
				a := &r.agents[i]
				var reply deliveries.InboxFetchReply
				var err error
				for try := 0; try < 3; try++ {
					if err = requestWithin(gctx, inboxRequest, nc, subjects.Agent(r.agent(i), deliveries.ActionInboxFetch), []byte(`{"after":0,"max":4}`), &reply); err == nil {
						break
					}
				}
				if err != nil {
					return fmt.Errorf("check %s: %w", r.agent(i), err)
				}
				mu.Lock()
				switch n := len(reply.Deliveries); {
				case n == 1 && a.seq != 0 && reply.Deliveries[0].Seq == a.seq && reply.Acked == a.seq:
					verified++
				case n == 0: // never delivered, or read and gone since
					res.Lost++
				case n > 1:
					res.Repeated += n - 1
				case a.seq == 0 && reply.Deliveries[0].Envelope != nil && strings.Contains(string(reply.Deliveries[0].Envelope), `"`+a.want+`"`):
					res.Late++ // delivered, not read before the give-up
				}
				mu.Unlock()
			}
		})
	}
	return verified, g.Wait()
}

// inboxConnect opens n connections that reconnect as chime's own do
// (forever, every 250 ms): the restart's recovery is chime's, not a
// client waiting out its default 2 s.
func inboxConnect(url string, n int) ([]*nats.Conn, func(), error) {
	var conns []*nats.Conn
	closeAll := func() {
		for _, nc := range conns {
			nc.Close()
		}
	}
	for range n {
		nc, err := nats.Connect(url, nats.Name("chime-bench inbox"), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("connect: %w", err)
		}
		conns = append(conns, nc)
	}
	return conns, closeAll, nil
}

// settledRSS is pid's RSS after inboxSettle.
func settledRSS(ctx context.Context, pid int) int64 {
	backoff.Sleep(ctx, inboxSettle)
	rss, _ := procMemory(pid)
	return rss
}

// streamBytes is what a stream stores, 0 when it cannot be read.
func streamBytes(ctx context.Context, nc *nats.Conn, stream string) uint64 {
	rctx, cancel := context.WithTimeout(ctx, inboxRequest)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, "$JS.API.STREAM.INFO."+stream, nil)
	if err != nil {
		return 0
	}
	var info struct {
		State struct {
			Bytes uint64 `json:"bytes"`
		} `json:"state"`
	}
	if json.Unmarshal(msg.Data, &info) != nil {
		return 0
	}
	return info.State.Bytes
}

// WriteText prints the run for people.
func (r *InboxResult) WriteText(w io.Writer) {
	const mib = 1 << 20
	fmt.Fprintf(w, "inbox: %d agents, one timer each, all due %d ms after the first create; reliable reads (inbox.fetch max %d, inbox.ack; %d ms time out), %d in flight over %d connections\n",
		r.Agents, r.LeadMs, r.Max, r.TimeoutMs, r.InFlight, r.Conns)
	fmt.Fprintf(w, "creates: %.0f/s (%d retried, due %.0f ms after the last)   all read and acked: %.1f s after the first create\n", r.CreatesPerS, r.CreateRetries, r.LeadMarginMs, r.ReadS)
	fmt.Fprintf(w, "delivered %d  lost %d  repeated %d  unexpected %d  not read in time %d  verified %d of %d  (redelivered after a failed ack: %d)\n",
		r.Delivered, r.Lost, r.Repeated, r.Unexpected, r.Late, r.Verified, r.Agents, r.Redelivered)
	fmt.Fprintf(w, "fetch: %d (%d empty, %d failed)  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.1f ms\n",
		r.Fetches, r.EmptyFetch, r.FetchErrors, r.FetchMs.P50, r.FetchMs.P90, r.FetchMs.P99, r.FetchMs.Max)
	fmt.Fprintf(w, "ack:   %d failed  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.1f ms\n", r.AckErrors, r.AckMs.P50, r.AckMs.P90, r.AckMs.P99, r.AckMs.Max)
	if x := r.Restart; x != nil {
		fmt.Fprintf(w, "nats-server SIGKILLed with %d read (rss %.1f MiB), restarted on its store: accepting connections after %.0f ms, first fetch answered after %.0f ms, all read after %.0f ms\n",
			x.AtRead, float64(x.ServerRSSBefore)/mib, x.ServerUpMs, x.FirstFetchMs, x.AllReadMs)
	}
	fmt.Fprintf(w, "rss: nats-server %.1f -> %.1f MiB (%.0f B per agent), chime %.1f -> %.1f MiB (%.0f B per agent)\n",
		float64(r.ServerIdleRSS)/mib, float64(r.ServerRSS)/mib, r.ServerPerAgent, float64(r.ChimeIdleRSS)/mib, float64(r.ChimeRSS)/mib, r.ChimePerAgent)
	var cpu strings.Builder
	for _, p := range r.CPU {
		fmt.Fprintf(&cpu, " %s %.1f", p.Name, p.ReadS)
	}
	fmt.Fprintf(w, "cpu seconds from the due time to the last read:%s\n", cpu.String())
	if c := r.Cold; c != nil {
		fmt.Fprintf(w, "idle restart: accepting connections after %.0f ms, a fetch answered after %.0f ms; nats-server rss %.1f MiB (%.0f B per agent)\n",
			c.ServerUpMs, c.FirstFetchMs, float64(c.ServerRSS)/mib, c.ServerPerAgent)
	}
	fmt.Fprintf(w, "stored: chime_agents %.1f MiB (%.0f B per agent), CHIME_INBOX %.1f MiB\n",
		float64(r.AgentsBucketBytes)/mib, float64(r.AgentsBucketBytes)/float64(max(r.Agents, 1)), float64(r.InboxBytes)/mib)
}
