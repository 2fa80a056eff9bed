package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/internal/directget"
	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/internal/netns"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// Kill kinds of a chaos run.
const (
	KillReplica = "replica" // SIGKILL a chime replica, restart it after Down
	KillServer  = "server"  // SIGKILL a nats-server (a random one), restart it on its store after Down
	KillLeader  = "leader"  // SIGKILL the leader of CHIME_INBOX or KV_chime_timers, in turn, and restart it
)

// Partition kinds of a chaos run: a network namespace cut off from every
// other for Down, then healed, its processes running all along.
const (
	PartitionInboxLeader  = "inbox-leader"  // the nats-server leading CHIME_INBOX
	PartitionTimersLeader = "timers-leader" // the nats-server leading KV_chime_timers
	PartitionReplica      = "replica"       // a chime replica, in turn
	PartitionNode         = "node"          // a nats-server leading neither, in turn (any, in turn, if each leads one)
)

// LateAfter is how late a delivery may be before it counts as late.
const LateAfter = 2 * time.Second

// ChaosOptions configures a chaos run: its own nats-servers and chime
// replicas (child processes of Exe), a steady load, and kills.
type ChaosOptions struct {
	Servers     int           // 1: a standalone nats-server; 3-5: a JetStream cluster, chime's streams at R3
	Replicas    int           // chime replicas, `serve` children of Exe
	Duration    time.Duration // how long load is applied and kills are done
	Rate        float64       // one-shot timers created per second, each due 1-5 s after creation
	Agents      int           // agents the timers and waits belong to
	Repeating   int           // repeating timers, created at the start and cancelled at the end
	Interval    time.Duration // their interval
	Calendar    int           // calendar timers firing every second (cron "* * * * * *", Europe/Berlin), created and cancelled with the repeating ones
	WaitRate    float64       // managed waits requested per second, 2-4 s each
	CancelEvery int           // every Nth one-shot is cancelled before it is due; 0: none
	Every       time.Duration // a kill every this
	Down        time.Duration // how long a killed process stays down
	Kill        []string      // kill kinds, done in turn
	// Partition kinds, done in turn instead of kills (the two exclude each
	// other): each server and replica then runs in a network namespace of
	// its own, and the bench talks to them from the host over a bridge.
	// Needs a cluster, root and the ip tool.
	Partition []string
	Grace     time.Duration // waited after the last due time before the inbox is read
	Keep      bool          // keep the work dir (stores, logs) even when nothing went wrong
	Exe       string        // the chime binary run as `serve`; default chime beside this binary, else on PATH
	Progress  io.Writer     // a line per phase and per kill; nil: none
	Log       *slog.Logger
}

// Validate checks the options.
func (o *ChaosOptions) Validate() error {
	switch {
	case o.Servers != 1 && (o.Servers < 3 || o.Servers > 5):
		return errors.New("bench: --servers must be 1 (standalone) or 3-5 (a cluster)")
	case o.Replicas < 1:
		return errors.New("bench: --replicas must be positive")
	case o.Duration <= 0:
		return errors.New("bench: --duration must be positive")
	case o.Rate < 0 || o.WaitRate < 0:
		return errors.New("bench: --rate and --wait-rate must not be negative")
	case o.Agents < 1:
		return errors.New("bench: --agents must be positive")
	case o.Repeating < 0 || o.Calendar < 0:
		return errors.New("bench: --repeating and --calendar must not be negative")
	case o.Repeating > 0 && o.Interval < time.Millisecond:
		return errors.New("bench: --interval must be at least 1ms")
	case o.CancelEvery < 0:
		return errors.New("bench: --cancel-every must not be negative")
	case o.Every <= 0:
		return errors.New("bench: --every must be positive")
	case o.Down < 0 || o.Grace < 0:
		return errors.New("bench: --down and --grace must not be negative")
	}
	for _, k := range o.Kill {
		if k != KillReplica && k != KillServer && k != KillLeader {
			return fmt.Errorf("bench: --kill: unknown kind %q (replica, server, leader)", k)
		}
	}
	for _, k := range o.Partition {
		if k != PartitionInboxLeader && k != PartitionTimersLeader && k != PartitionReplica && k != PartitionNode {
			return fmt.Errorf("bench: --partition: unknown kind %q (inbox-leader, timers-leader, replica, node)", k)
		}
	}
	if len(o.Partition) > 0 {
		switch {
		case len(o.Kill) > 0:
			return errors.New("bench: --partition and --kill exclude each other: give --kill \"\" with --partition")
		case o.Servers < 3:
			return errors.New("bench: --partition needs a cluster (--servers 3-5): a partitioned standalone server is just a down one")
		}
	}
	return nil
}

// The load's shape.
const (
	oneShotMinMs   = 1000 // one-shots are due 1-5 s after creation
	oneShotMaxMs   = 5000
	waitMinSeconds = 2 // waits last 2-4 s
	waitMaxSeconds = 4
	cancelAfter    = 300 * time.Millisecond // a cancelled one-shot is cancelled this long after its create
	attemptTimeout = 3 * time.Second        // one request
	requestBudget  = 20 * time.Second       // one request and its retries
	inflightMax    = 512                    // requests in flight; the pacers wait beyond
	replicaReady   = 60 * time.Second
	clusterReplica = 3  // CHIME_JS_REPLICAS on a cluster
	chaosShards    = 32 // CHIME_SHARDS, the default, set for the report
)

// chaosRun is the state of one run.
type chaosRun struct {
	o        ChaosOptions
	work     *workDir
	conns    []*nats.Conn
	js       jetstream.JetStream
	cluster  *natsproc.ClusterT // nil on a standalone server
	lab      *netns.Lab         // with partitions: a namespace per server and replica
	servers  []*natsproc.Server
	replicas []*replicaProc
	start    time.Time // when load began

	mu          sync.Mutex
	timers      map[string]*timerReq // acknowledged creates, by timer ID
	waits       map[string]*waitReq  // acknowledged requests, by wait ID
	kills       []*killRecord
	createFail  int
	waitFail    int
	cancelFail  int
	lastDue     time.Time
	stats       requestStats
	failedAt    []time.Time // when each attempt that failed for want of chime (not a real answer) began
	otherOnce   sync.Once
	nextReplica int
	leaderTurn  int
	nodeTurn    int
}

type requestStats struct {
	requests, retries, unavailable, internal, timeouts, noResponders, otherErrors atomic.Int64
}

// timerReq is a create the bench got a reply for.
type timerReq struct {
	id, agent       string
	repeating       bool
	due             time.Time // first due time, from the reply
	cancelled       time.Time // when a cancel was acknowledged; zero if none
	cancelCompleted bool      // the cancel found it completed: it had fired
}

// waitReq is a wait request the bench got a reply for.
type waitReq struct {
	id, agent string
	target    time.Time // zero when a retry found it already created
}

func (r *chaosRun) progress(format string, args ...any) {
	if r.o.Progress != nil {
		fmt.Fprintf(r.o.Progress, "chaos: "+format+"\n", args...)
	}
}

// since is t as seconds into the load.
func (r *chaosRun) since(t time.Time) float64 {
	return float64(t.Sub(r.start).Milliseconds()) / 1000
}

// Chaos runs the fault run. The result is returned with a nil error even
// when deliveries were lost or duplicated; its Err says so.
func Chaos(ctx context.Context, o ChaosOptions) (res *ChaosResult, err error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Exe, err = ownExe(o.Exe); err != nil {
		return nil, err
	}
	r := &chaosRun{o: o, timers: map[string]*timerReq{}, waits: map[string]*waitReq{}}
	if r.work, err = newWorkDir(r.progress); err != nil {
		return nil, err
	}
	defer func() {
		r.work.close()
		// A failed run is kept for its logs, unless it failed before
		// anything was written.
		entries, _ := os.ReadDir(r.work.dir)
		if o.Keep || (res != nil && !res.OK) || (err != nil && len(entries) > 0) {
			r.progress("work dir kept: %s", r.work.dir)
			if res != nil {
				res.WorkDir = r.work.dir
			}
			return
		}
		_ = os.RemoveAll(r.work.dir)
	}()

	if len(o.Partition) > 0 {
		if err := r.makeLab(ctx); err != nil {
			return nil, err
		}
	}
	if err := r.startNATS(ctx); err != nil {
		return nil, err
	}
	if err := r.startReplicas(ctx); err != nil {
		return nil, err
	}
	if err := r.connect(); err != nil {
		return nil, err
	}
	defer func() {
		for _, nc := range r.conns {
			nc.Close()
		}
	}()
	if err := r.load(ctx); err != nil {
		return nil, err
	}
	stale := r.waitCurrent(ctx)
	obs, err := r.observe(ctx)
	if err != nil {
		return nil, err
	}
	res = r.analyze(obs)
	res.NotCurrentAtRead = stale
	if !res.OK {
		r.holders(ctx, res.LostShards)
		r.dumpReplicas(ctx)
	}
	if r.lab != nil {
		if acks := r.duplicateAcks(ctx); len(acks) > 0 {
			res.DuplicateAcks = acks
		}
	}
	return res, nil
}

func (r *chaosRun) startNATS(ctx context.Context) error {
	begin := time.Now()
	if r.o.Servers == 1 {
		r.progress("starting a standalone nats-server (work dir %s)", r.work.dir)
		s, err := r.work.standalone()
		if err != nil {
			return fmt.Errorf("bench: nats-server: %w", err)
		}
		r.servers = []*natsproc.Server{s}
	} else {
		r.progress("starting a cluster of %d nats-servers (work dir %s)", r.o.Servers, r.work.dir)
		var each func(int, *natsproc.Options)
		if r.lab != nil {
			each = func(i int, o *natsproc.Options) {
				m := r.lab.Member(o.Name)
				o.Host, o.Wrap = m.Addr.String(), m.Wrap()
			}
		}
		var err error
		if r.cluster, err = r.work.cluster(ctx, r.o.Servers, each); err != nil {
			return fmt.Errorf("bench: nats cluster: %w", err)
		}
		r.servers = r.cluster.Servers
	}
	r.progress("nats ready in %v: %s", time.Since(begin).Round(time.Millisecond), r.urls())
	return nil
}

func (r *chaosRun) urls() string {
	if r.cluster != nil {
		return r.cluster.URLs()
	}
	return r.servers[0].ClientURL()
}

func (r *chaosRun) jsReplicas() int {
	if r.cluster != nil {
		return clusterReplica
	}
	return 1
}

// startReplicas starts the chime replicas one after the other (the first
// provisions the streams and buckets), each on its own HTTP port, and waits
// until each is ready.
func (r *chaosRun) startReplicas(ctx context.Context) error {
	begin := time.Now()
	ports, err := natsproc.FreePorts(2 * r.o.Replicas)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	var tokensFile string
	if r.lab != nil {
		if tokensFile, err = r.operatorTokens(); err != nil {
			return err
		}
	}
	for i := range r.o.Replicas {
		p := &replicaProc{
			id:        fmt.Sprintf("chaos-r%d", i+1),
			httpAddr:  fmt.Sprintf("127.0.0.1:%d", ports[i]),
			pprofAddr: fmt.Sprintf("127.0.0.1:%d", ports[r.o.Replicas+i]),
			exe:       r.o.Exe,
		}
		if r.lab != nil {
			// In its namespace, on its address: the host reaches it over
			// the bridge, and it can be cut off.
			m := r.lab.Member(p.id)
			p.httpAddr, p.wrap = fmt.Sprintf("%s:%d", m.Addr, ports[i]), m.Wrap()
			// Profiles are served on loopback only, which in its
			// namespace the host cannot reach.
			p.pprofAddr = ""
		}
		p.logPath = filepath.Join(r.work.dir, p.id+".log")
		// Later entries win: the run's own settings over the caller's.
		p.env = append(os.Environ(),
			"CHIME_NATS_URL="+r.urls(),
			fmt.Sprintf("CHIME_JS_REPLICAS=%d", r.jsReplicas()),
			"CHIME_HTTP_ADDR="+p.httpAddr,
			"CHIME_REPLICA_ID="+p.id,
			fmt.Sprintf("CHIME_SHARDS=%d", chaosShards), // the report maps losses to shards
			// The run paces its own creates and counts what fails: a
			// per-agent rate limit would only add refusals to its count.
			"CHIME_CREATE_RATE=0",
		)
		if r.o.Repeating > 0 && r.o.Interval < time.Second {
			// Shorter than the default minimum: the run asked for it.
			p.env = append(p.env, "CHIME_MIN_INTERVAL="+r.o.Interval.Truncate(time.Millisecond).String())
		}
		if tokensFile != "" {
			p.env = append(p.env, "CHIME_OPERATOR_TOKENS_FILE="+tokensFile)
		}
		if p.pprofAddr != "" {
			// A failed run dumps each replica's goroutines (dumpReplicas).
			p.env = append(p.env, "CHIME_PPROF_ADDR="+p.pprofAddr)
		}
		r.work.Cleanup(p.kill)
		r.replicas = append(r.replicas, p)
		if err := p.start(); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if err := p.waitReady(ctx, replicaReady); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	r.progress("%d chime replicas ready in %v", r.o.Replicas, time.Since(begin).Round(time.Millisecond))
	return nil
}

// connect opens the bench's connections: they reconnect forever, as an
// agent's would.
func (r *chaosRun) connect() error {
	opts := []nats.Option{nats.Name("chime-bench chaos"), nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}
	if r.lab != nil {
		// A connection to a cut server sees no reset: only missed pings
		// or a stalled write tell (see engine.WriteStall), and the run's
		// connections must move to a server it can reach within seconds,
		// as an agent's would be expected to.
		opts = append(opts, nats.PingInterval(time.Second), nats.MaxPingsOutstanding(2), nats.Timeout(2*time.Second),
			nats.FlusherTimeout(2*time.Second), nats.ReconnectOnFlusherError())
	}
	for range 4 {
		nc, err := nats.Connect(r.urls(), opts...)
		if err != nil {
			return fmt.Errorf("bench: connect: %w", err)
		}
		r.conns = append(r.conns, nc)
	}
	js, err := jetstream.New(r.conns[0])
	if err != nil {
		return fmt.Errorf("bench: jetstream: %w", err)
	}
	r.js = js
	return nil
}

func (r *chaosRun) agent(i int) string { return fmt.Sprintf("chaos-%d", i%r.o.Agents) }

func (r *chaosRun) client(i int) *client.Client {
	c, _ := client.New(r.conns[i%len(r.conns)], r.agent(i)) // the agent IDs are valid
	return c
}

// load creates the repeating timers, then for Duration the one-shots and
// waits at their rates while the kills run; then it cancels the repeating
// timers and waits until everything due is due, plus Grace.
func (r *chaosRun) load(ctx context.Context) error {
	if err := r.createRepeating(ctx); err != nil {
		return err
	}
	r.start = time.Now()
	faults := "kills"
	if len(r.o.Partition) > 0 {
		faults = "partitions"
	}
	r.progress("load for %v: %g one-shot timers/s (due 1-5 s), %d repeating every %v, %d calendar every second, %g waits/s (2-4 s), %d agents; %s every %v (%s), down %v",
		r.o.Duration, r.o.Rate, r.o.Repeating, r.o.Interval, r.o.Calendar, r.o.WaitRate, r.o.Agents, faults, r.o.Every, strings.Join(r.faultKinds(), ","), r.o.Down)
	loadCtx, stop := context.WithTimeout(ctx, r.o.Duration)
	defer stop()
	sem := make(chan struct{}, inflightMax)
	var inflight, workers sync.WaitGroup
	workers.Go(func() { pace(loadCtx, r.o.Rate, sem, &inflight, func(seq int) { r.oneShot(ctx, seq) }) })
	workers.Go(func() { pace(loadCtx, r.o.WaitRate, sem, &inflight, func(seq int) { r.wait(ctx, seq) }) })
	workers.Go(func() { r.killer(loadCtx, ctx) })
	workers.Wait()
	inflight.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	created, waited := len(r.timers)-r.o.Repeating-r.o.Calendar, len(r.waits)
	r.mu.Unlock()
	r.progress("load done at %.1fs: %d one-shot timers and %d waits acknowledged, %d %s", r.since(time.Now()), created, waited, len(r.kills), faults)
	r.cancelRepeating(ctx)

	r.mu.Lock()
	last := r.lastDue
	for _, k := range r.kills {
		if k.back.After(last) {
			last = k.back
		}
	}
	r.mu.Unlock()
	last = last.Add(r.o.Grace)
	r.progress("waiting %v: until the last due time or restart plus %v grace", time.Until(last).Round(100*time.Millisecond), r.o.Grace)
	if !backoff.Sleep(ctx, time.Until(last)) {
		return ctx.Err()
	}
	return nil
}

// pace calls fn(seq) for seq 0, 1, ... at rate per second until ctx ends,
// each in its own goroutine, with at most cap(sem) in flight: when
// requests stall the pace waits, then catches up.
func pace(ctx context.Context, rate float64, sem chan struct{}, inflight *sync.WaitGroup, fn func(int)) {
	if rate <= 0 {
		return
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	start := time.Now()
	next := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for want := int(time.Since(start).Seconds() * rate); next < want; next++ {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			seq := next
			inflight.Go(func() {
				defer func() { <-sem }()
				fn(seq)
			})
		}
	}
}

// call runs one request until it gets a real answer: chime answers
// `unavailable`, and requests time out or find no responder, while a
// server, a stream leader or a replica is down.
func (r *chaosRun) call(ctx context.Context, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, requestBudget)
	defer cancel()
	for attempt := 0; ; attempt++ {
		r.stats.requests.Add(1)
		if attempt > 0 {
			r.stats.retries.Add(1)
		}
		began := time.Now()
		actx, acancel := context.WithTimeout(ctx, attemptTimeout)
		err := fn(actx)
		acancel()
		if err == nil {
			return nil
		}
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code == subjects.CodeUnavailable || e.Code == subjects.CodeInternal {
			r.mu.Lock()
			r.failedAt = append(r.failedAt, began)
			r.mu.Unlock()
		}
		switch {
		case errors.As(err, &e) && e.Code == subjects.CodeUnavailable:
			r.stats.unavailable.Add(1)
		case errors.As(err, &e) && e.Code == subjects.CodeInternal:
			r.stats.internal.Add(1)
		case errors.As(err, &e):
			return err // a real answer
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
			r.stats.timeouts.Add(1)
		case errors.Is(err, nats.ErrNoResponders):
			r.stats.noResponders.Add(1)
		default:
			r.stats.otherErrors.Add(1)
			r.otherOnce.Do(func() { r.o.Log.Warn("bench chaos: request failed; retrying", "err", err) })
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return err
		}
	}
}

func (r *chaosRun) noteDue(t time.Time) {
	if t.After(r.lastDue) {
		r.lastDue = t
	}
}

func (r *chaosRun) createRepeating(ctx context.Context) error {
	for i := range r.o.Repeating {
		c := r.client(i)
		// First due times spread over one interval, from one interval on.
		first := r.o.Interval + time.Duration(i)*r.o.Interval/time.Duration(r.o.Repeating)
		var t *timers.Timer
		err := r.call(ctx, func(ctx context.Context) (err error) {
			t, err = c.CreateTimer(ctx, max(first.Milliseconds(), 1), r.o.Interval.Milliseconds(), fmt.Sprintf("chaos repeating %d", i))
			return err
		})
		if err != nil {
			return fmt.Errorf("bench: create repeating timer: %w", err)
		}
		r.mu.Lock()
		r.timers[t.ID] = &timerReq{id: t.ID, agent: r.agent(i), repeating: true, due: dueOf(t)}
		r.mu.Unlock()
	}
	for i := range r.o.Calendar {
		c := r.client(i)
		var t *timers.Timer
		err := r.call(ctx, func(ctx context.Context) (err error) {
			t, err = c.CreateCalendarTimer(ctx, chaosCalendar(), fmt.Sprintf("chaos calendar %d", i), client.WithRequestID(fmt.Sprintf("chaos-calendar-%d", i)))
			return err
		})
		if err != nil {
			return fmt.Errorf("bench: create calendar timer: %w", err)
		}
		r.mu.Lock()
		r.timers[t.ID] = &timerReq{id: t.ID, agent: r.agent(i), repeating: true, due: dueOf(t)}
		r.mu.Unlock()
	}
	return nil
}

// chaosCalendar is the calendar timers' schedule: every second, in a zone
// that is not UTC, missed ones caught up once (the default).
func chaosCalendar() timers.CalendarSpec {
	return timers.CalendarSpec{Cron: "* * * * * *", TZ: "Europe/Berlin"}
}

func (r *chaosRun) cancelRepeating(ctx context.Context) {
	r.mu.Lock()
	var reps []*timerReq
	for _, t := range r.timers {
		if t.repeating {
			reps = append(reps, t)
		}
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, t := range reps {
		wg.Go(func() {
			c, _ := client.New(r.conns[0], t.agent)
			err := r.call(ctx, func(ctx context.Context) error { _, err := c.CancelTimer(ctx, t.id); return err })
			r.mu.Lock()
			defer r.mu.Unlock()
			if err != nil {
				r.cancelFail++
				return
			}
			t.cancelled = time.Now()
			r.noteDue(t.cancelled)
		})
	}
	wg.Wait()
}

func dueOf(t *timers.Timer) time.Time {
	if t.NextFireAt != nil {
		return *t.NextFireAt
	}
	return t.CreatedAt.Add(time.Duration(t.DurationMs) * time.Millisecond)
}

func (r *chaosRun) oneShot(ctx context.Context, seq int) {
	c := r.client(seq)
	ms := int64(oneShotMinMs + rand.IntN(oneShotMaxMs-oneShotMinMs+1))
	var t *timers.Timer
	err := r.call(ctx, func(ctx context.Context) (err error) {
		t, err = c.CreateTimer(ctx, ms, 0, fmt.Sprintf("chaos %d", seq))
		return err
	})
	r.mu.Lock()
	if err != nil {
		r.createFail++
		r.mu.Unlock()
		return
	}
	req := &timerReq{id: t.ID, agent: r.agent(seq), due: dueOf(t)}
	r.timers[t.ID] = req
	r.noteDue(req.due)
	r.mu.Unlock()

	if r.o.CancelEvery == 0 || seq%r.o.CancelEvery != r.o.CancelEvery-1 || !backoff.Sleep(ctx, cancelAfter) {
		return
	}
	err = r.call(ctx, func(ctx context.Context) error { _, err := c.CancelTimer(ctx, t.ID); return err })
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		req.cancelled = time.Now()
	case errors.Is(err, subjects.ErrTimerCompleted):
		req.cancelCompleted = true
	default:
		r.cancelFail++
	}
}

func (r *chaosRun) wait(ctx context.Context, seq int) {
	c := r.client(seq)
	id := fmt.Sprintf("cw%d", seq)
	body, _ := json.Marshal(map[string]any{"seconds": waitMinSeconds + rand.IntN(waitMaxSeconds-waitMinSeconds+1), "id": id})
	var reply waits.WaitReply
	err := r.call(ctx, func(ctx context.Context) error { return c.Request(ctx, waits.ActionWaitRequest, body, &reply) })
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		target, _ := waits.ParseUntil(reply.TargetTime, time.UTC)
		r.waits[id] = &waitReq{id: id, agent: r.agent(seq), target: target}
		r.noteDue(target)
	case errors.Is(err, waits.ErrWaitExists): // an attempt whose reply was lost created it
		r.waits[id] = &waitReq{id: id, agent: r.agent(seq)}
		r.noteDue(time.Now().Add(waitMaxSeconds * time.Second))
	default:
		r.waitFail++
	}
}

// observed is what the run left: the records and the inbox.
type observed struct {
	timers map[string]*timers.Timer // by timer ID
	waits  map[string]*waits.Wait   // by wait ID
	inbox  []inboxMsg
}

type inboxMsg struct {
	env    subjects.Envelope
	stored time.Time // when the inbox stream stored it
}

// observe reads every timer and wait record and the whole inbox stream,
// each from the start again after an error: a cluster that was just
// restarted can still answer a JetStream request with no responders.
func (r *chaosRun) observe(ctx context.Context) (*observed, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	obs := &observed{}
	err := r.reading(ctx, "timer records", func(ctx context.Context) error {
		obs.timers = map[string]*timers.Timer{}
		// Finished timers leave the bucket for the history; one in both
		// (moved, its key not purged yet) is the same record.
		return readRecords(ctx, r.js, engine.TimersBucket, engine.HistoryTimers, func(b []byte) error {
			var t timers.Timer
			if err := json.Unmarshal(b, &t); err != nil {
				return err
			}
			obs.timers[t.ID] = &t
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	err = r.reading(ctx, "wait records", func(ctx context.Context) error {
		obs.waits = map[string]*waits.Wait{}
		return readRecords(ctx, r.js, engine.WaitsBucket, engine.HistoryWaits, func(b []byte) error {
			var w waits.Wait
			if err := json.Unmarshal(b, &w); err != nil {
				return err
			}
			obs.waits[w.ID] = &w
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	err = r.reading(ctx, "the inbox", func(ctx context.Context) (err error) {
		obs.inbox, err = readInbox(ctx, r.js)
		return err
	})
	if err != nil {
		return nil, err
	}
	r.progress("read %d timer records, %d wait records, %d inbox messages", len(obs.timers), len(obs.waits), len(obs.inbox))
	return obs, nil
}

// readCurrentTries bounds waitCurrent: this many WaitStreamCurrent
// rounds of at most 20 s each per stream.
const readCurrentTries = 3

// waitCurrent waits, on a cluster, until chime's streams and the history
// have every replica current before they are read: direct gets (the
// history's records) are answered by any replica, and one still catching
// up after a fault answers with what it has, which would count as lost
// or not applied. It returns the streams still behind, read anyway.
func (r *chaosRun) waitCurrent(ctx context.Context) []string {
	if r.cluster == nil {
		return nil
	}
	var behind []string
	for _, st := range append(slices.Clone(chimeStreams), engine.HistoryStream) {
		var err error
		for range readCurrentTries {
			if err = r.cluster.WaitStreamCurrent(ctx, r.js, st); err == nil || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			r.progress("reading while %s is not current: %v", st, err)
			behind = append(behind, st)
		}
	}
	return behind
}

// reading runs read up to 5 times, 2 s apart, until it succeeds.
func (r *chaosRun) reading(ctx context.Context, what string, read func(context.Context) error) error {
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		if err = read(ctx); err == nil {
			return nil
		}
		r.progress("reading %s (attempt %d): %v", what, attempt, err)
		if !backoff.Sleep(ctx, 2*time.Second) {
			break
		}
	}
	return err
}

// readRecords reads a kind's records: those in CHIME_HISTORY under prefix
// (none when a build without it made the store), then those in bucket.
func readRecords(ctx context.Context, js jetstream.JetStream, bucket, prefix string, fn func([]byte) error) error {
	if _, err := js.Stream(ctx, engine.HistoryStream); err == nil {
		err := directget.New(js, engine.HistoryStream).Walk(ctx, directget.Request{NextFor: prefix + ".>", Batch: 256}, func(m *directget.Msg) error {
			if err := fn(m.Data); err != nil {
				return fmt.Errorf("bench: %s %s: %w", engine.HistoryStream, m.Subject, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("bench: read %s: %w", engine.HistoryStream, err)
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("bench: %s: %w", engine.HistoryStream, err)
	}
	return readBucket(ctx, js, bucket, fn)
}

func readBucket(ctx context.Context, js jetstream.JetStream, bucket string, fn func([]byte) error) error {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return fmt.Errorf("bench: bucket %s: %w", bucket, err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("bench: watch %s: %w", bucket, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return nil // the initial values are done
			}
			if err := fn(e.Value()); err != nil {
				return fmt.Errorf("bench: %s %s: %w", bucket, e.Key(), err)
			}
		case <-ctx.Done():
			return fmt.Errorf("bench: read %s: %w", bucket, ctx.Err())
		}
	}
}

// readInbox reads every message stored in the inbox stream.
func readInbox(ctx context.Context, js jetstream.JetStream) ([]inboxMsg, error) {
	stream, err := js.Stream(ctx, engine.InboxStream)
	if err != nil {
		return nil, fmt.Errorf("bench: inbox stream: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench: inbox stream: %w", err)
	}
	total := int(info.State.Msgs)
	if total == 0 {
		return nil, nil
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("bench: inbox consumer: %w", err)
	}
	out := make([]inboxMsg, 0, total)
	for len(out) < total {
		batch, err := cons.Fetch(min(total-len(out), 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("bench: read inbox: %w", err)
		}
		n := len(out)
		for m := range batch.Messages() {
			var d inboxMsg
			if err := json.Unmarshal(m.Data(), &d.env); err != nil {
				return nil, fmt.Errorf("bench: inbox message on %s: %w", m.Subject(), err)
			}
			if md, err := m.Metadata(); err == nil {
				d.stored = md.Timestamp
			}
			out = append(out, d)
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("bench: read inbox: %w", err)
		}
		if len(out) == n {
			return nil, fmt.Errorf("bench: read inbox: no progress after %d of %d messages", n, total)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("bench: read inbox: %w", ctx.Err())
		}
	}
	return out, nil
}

// stalledLine is the scheduler's report of shards held but not firing.
const stalledLine = "shards held but not firing"

// replicaLogCounts counts each replica's WARN and ERROR lines, and the
// stalled-shard reports among them.
func (r *chaosRun) replicaLogCounts() map[string]LogCounts {
	out := map[string]LogCounts{}
	for _, p := range r.replicas {
		b, err := os.ReadFile(p.logPath)
		if err != nil {
			continue
		}
		var c LogCounts
		for line := range strings.Lines(string(b)) {
			switch {
			case strings.Contains(line, "level=WARN") || strings.Contains(line, `"level":"WARN"`):
				c.Warn++
				if strings.Contains(line, stalledLine) {
					c.Stalls++
				}
			case strings.Contains(line, "level=ERROR") || strings.Contains(line, `"level":"ERROR"`):
				c.Error++
			}
		}
		c.Starts = p.starts
		out[p.id] = c
	}
	return out
}

// sortedKinds is the kill kinds in a stable order for printing.
func sortedKinds(m map[string]int) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
