package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// ScaleOptions configures a scale run: for each replica count, fresh
// nats-servers and that many chime replicas (child processes of Exe), a
// burst of one-shot creates, and the same timers all due at one instant.
type ScaleOptions struct {
	Servers  int           // 1: a standalone nats-server; 3-5: a JetStream cluster, chime's streams at R3
	Replicas []int         // replica counts, each measured on its own fresh NATS
	N        int           // one-shot timers created per replica count
	Agents   int           // agents they are spread over
	Clients  int           // creates in flight
	Lead     time.Duration // the common due time after the start of the creates
	// Partitions is the replicas' CHIME_PARTITIONS: 0, one bucket per
	// kind watched whole by every replica; P, P buckets per kind, each
	// replica watching only the keys of the shards it holds.
	Partitions int
	Exe        string    // the chime binary run as `serve`; default chime beside this binary, else on PATH
	Progress   io.Writer // a line per phase; nil: none
	// ProfileDir, when set, receives CPU profiles of every replica
	// (CHIME_PPROF_ADDR): ProfileSeconds from the first create, and as
	// long from just before the due time (the fires and their records).
	ProfileDir     string
	ProfileSeconds int
}

// Validate checks the options.
func (o *ScaleOptions) Validate() error {
	switch {
	case o.Servers != 1 && (o.Servers < 3 || o.Servers > 5):
		return errors.New("bench: --servers must be 1 (standalone) or 3-5 (a cluster)")
	case len(o.Replicas) == 0:
		return errors.New("bench: --replicas must name at least one replica count")
	case o.N <= 0:
		return errors.New("bench: -n must be positive")
	case o.Agents <= 0:
		return errors.New("bench: --agents must be positive")
	case o.Clients <= 0:
		return errors.New("bench: -c must be positive")
	case o.Lead <= 0:
		return errors.New("bench: --lead must be positive")
	case o.Partitions < 0:
		return errors.New("bench: --partitions must be 0 (one bucket per kind) or positive")
	case o.ProfileDir != "" && o.ProfileSeconds < 1:
		return errors.New("bench: --profile-seconds must be at least 1")
	}
	for _, r := range o.Replicas {
		if r < 1 {
			return fmt.Errorf("bench: --replicas: %d is not a positive replica count", r)
		}
	}
	return nil
}

// ParseReplicas reads a comma-separated list of replica counts, e.g. "1,2,3".
func ParseReplicas(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bench: --replicas: %q is not a positive replica count", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("bench: --replicas must name at least one replica count")
	}
	return out, nil
}

// ScaleResult is a scale run: one ScaleRun per replica count.
type ScaleResult struct {
	Servers    int        `json:"servers"`
	JSReplicas int        `json:"js_replicas"`
	N          int        `json:"n"`
	Agents     int        `json:"agents"`
	Clients    int        `json:"clients"`
	LeadMs     int64      `json:"lead_ms"`
	Partitions int        `json:"partitions"`
	Runs       []ScaleRun `json:"runs"`
}

// ScaleRun is what one replica count measured.
type ScaleRun struct {
	Replicas      int     `json:"replicas"`
	CreatesPerS   float64 `json:"creates_per_s"`
	CreateSeconds float64 `json:"create_s"`
	// LeadMarginMs is the due time minus the end of the creates: negative
	// when the creates overran the lead, and the late ones fired at once.
	LeadMarginMs float64 `json:"lead_margin_ms"`
	FiresPerS    float64 `json:"fires_per_s"` // first to last arrival
	// FireSeconds is the fire phase: from just before the due time to the
	// last arrival (or the give-up deadline when some never came).
	FireSeconds float64 `json:"fire_s"`
	LatenessMs  Latency `json:"lateness_ms"`
	Missed      int     `json:"missed"`
	Duplicates  int     `json:"duplicates"`
	// The records phase: a fire's record update follows its stored
	// envelope, held back while fires are in flight. RecordsSeconds is from
	// the last arrival until the replicas' chime_timer_fires_applied_total
	// sums to the arrivals (Applied, the last sum read if it never did);
	// AppliedPerS is the arrivals over the time from the due time to then.
	RecordsSeconds float64 `json:"records_s"`
	Applied        int64   `json:"applied"`
	AppliedPerS    float64 `json:"applied_per_s"`
	// CPU is each process's CPU time (user+system, from /proc) in each
	// phase: the replicas, the nats-servers, the bench itself, and the
	// whole machine (every process on it, ours and others').
	CPU []ProcCPU `json:"cpu"`
	// ServerCPUPerCreateUs is the nats-servers' CPU time in the create
	// phase, summed over the servers, per create (microseconds).
	// ServerIdleCores is their CPU time from the end of the creates to
	// just before the due time over that wall time: the fleet's standing
	// cost (heartbeats, leases), which the create phase includes too.
	ServerCPUPerCreateUs float64 `json:"server_cpu_per_create_us"`
	ServerIdleCores      float64 `json:"server_idle_cores"`
	// Changes is what each replica's watches delivered to its scheduler
	// (chime_scheduler_changes_total) from the first create to just
	// before the due time, when nothing but the creates changes a timer
	// or wait.
	Changes []ReplicaChanges `json:"changes"`
}

// ReplicaChanges is the timer and wait changes one replica received and
// decoded for the creates, in all and per create.
type ReplicaChanges struct {
	Name      string  `json:"name"`
	Changes   int64   `json:"changes"`
	PerCreate float64 `json:"per_create"`
	// Shards held before the creates and just before the due time: a
	// shard that moved between reloads its records on the gainer, which
	// counts them again.
	ShardsBefore int `json:"shards_before"`
	ShardsAfter  int `json:"shards_after"`
}

// ProcCPU is one process's CPU seconds in the create, fire and records
// phases; divided by the phase's wall seconds it is cores busy.
type ProcCPU struct {
	Name     string  `json:"name"` // r1.. (replicas), n1.. or standalone (nats-servers), bench, machine
	CreateS  float64 `json:"create_s"`
	FireS    float64 `json:"fire_s"`
	RecordsS float64 `json:"records_s"`
}

// The scale run's fixed shape.
const (
	createTimeout = 10 * time.Second // one create request
	fireMargin    = 50 * time.Millisecond
	fireGiveUp    = 30 * time.Second // waited past the due time for arrivals beyond N/1000 s
	recordsBound  = time.Minute      // for the record updates after the last arrival
	scaleConns    = 4                // connections the creates are spread over
	shardsStable  = 2 * time.Second  // every replica's shards held unchanged before the creates
	shardsBound   = time.Minute
)

// Scale runs the scale measurements, one replica count after the other,
// each on fresh nats-servers.
func Scale(ctx context.Context, o ScaleOptions) (*ScaleResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var err error
	if o.Exe, err = ownExe(o.Exe); err != nil {
		return nil, err
	}
	res := &ScaleResult{Servers: o.Servers, JSReplicas: jsReplicasFor(o.Servers), N: o.N, Agents: o.Agents, Clients: o.Clients, LeadMs: o.Lead.Milliseconds(), Partitions: o.Partitions}
	res.Runs, err = forEachCount(o.Replicas, func(r int) (*ScaleRun, error) { return scaleOne(ctx, o, r) })
	if err != nil {
		return nil, err
	}
	return res, nil
}

// ownExe is exe, or when exe is empty the chime binary beside this one
// (chime-bench), else chime on PATH: the replicas run it as `chime serve`.
func ownExe(exe string) (string, error) {
	if exe != "" {
		return exe, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("bench: find own binary: %w", err)
	}
	beside := filepath.Join(filepath.Dir(self), "chime")
	if st, err := os.Stat(beside); err == nil && !st.IsDir() && beside != self {
		return beside, nil
	}
	exe, err = exec.LookPath("chime")
	if err != nil {
		return "", fmt.Errorf("bench: no chime binary beside %s nor on PATH (go build ./cmd/chime, or --exe): %w", self, err)
	}
	return exe, nil
}

// forEachCount runs one per replica count, in order, each on its own
// fleet, and stops at the first error.
func forEachCount[R any](replicas []int, one func(int) (*R, error)) ([]R, error) {
	var runs []R
	for _, r := range replicas {
		run, err := one(r)
		if err != nil {
			return nil, fmt.Errorf("bench: %d replicas: %w", r, err)
		}
		runs = append(runs, *run)
	}
	return runs, nil
}

func scaleOne(ctx context.Context, o ScaleOptions, replicas int) (run *ScaleRun, err error) {
	progress := progressf(o.Progress, "scale")
	f, err := startFleet(ctx, fleetOptions{
		servers: o.Servers, replicas: replicas, exe: o.Exe, progress: progress, pprof: o.ProfileDir != "",
		// Quotas off: the per-agent count and create rate limits are not
		// what is measured.
		env: []string{"CHIME_CREATE_RATE=0", "CHIME_MAX_TIMERS_PER_AGENT=0", "CHIME_PARTITIONS=" + strconv.Itoa(o.Partitions)},
	})
	if err != nil {
		return nil, err
	}
	// The work dir (the replicas' logs) is kept when a fire went missing
	// or came twice, or the records did not all follow, as when the run
	// failed.
	defer func() {
		f.close(err != nil || run != nil && (run.Missed > 0 || run.Duplicates > 0 || run.Applied < int64(o.N-run.Missed)))
	}()

	conns, closeConns, err := connectN(f.urls(), scaleConns, "chime-bench scale")
	if err != nil {
		return nil, err
	}
	defer closeConns()
	prefix := fmt.Sprintf("s%d-%d", replicas, time.Now().UnixNano()%1e6)
	agent := func(i int) string { return fmt.Sprintf("%s-%d", prefix, i%o.Agents) }

	// Subscribe first, as an agent would, on a connection of its own.
	sub, err := nats.Connect(f.urls(), nats.Name("chime-bench scale inbox"))
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer sub.Close()
	inbox := newArrivals(subjects.HeaderMsgID, o.N)
	s, err := sub.Subscribe(subjects.AgentWildcard(subjects.ActionInbox), func(m *nats.Msg) {
		if strings.HasPrefix(m.Subject, "agent."+prefix+"-") {
			inbox.add(m)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	s.SetPendingLimits(-1, -1)
	if err := sub.Flush(); err != nil {
		return nil, fmt.Errorf("flush: %w", err)
	}

	run = &ScaleRun{Replicas: replicas}
	progress("%d replicas: creating %d one-shot timers over %d agents, %d in flight, all due in %v", replicas, o.N, o.Agents, o.Clients, o.Lead)
	profiles := f.profiler(ctx, o.ProfileDir, o.ProfileSeconds, fmt.Sprintf("scale-s%d-r%d", o.Servers, replicas))
	defer func() {
		if perr := profiles.wait(); err == nil && perr != nil {
			err = perr
		}
	}()
	// The leases first settle, so that no shard moves (and reloads its
	// records on its gainer) among the changes counted.
	if !waitShardsStable(ctx, f.replicas, shardsStable, shardsBound) {
		progress("%d replicas: shards held did not hold still for %v within %v; measuring anyway", replicas, shardsStable, shardsBound)
	}
	changes0, shards0, err := f.changes(ctx)
	if err != nil {
		return nil, err
	}
	cpu0 := f.cpu()
	start := time.Now()
	due := start.Add(o.Lead)
	profiles.start("create")
	err = createTimers(ctx, conns, o.N, o.Clients, agent, func() int64 { return max(time.Until(due).Milliseconds(), 1) })
	if err != nil {
		return nil, err
	}
	created := time.Now()
	cpu1 := f.cpu()
	run.CreateSeconds = created.Sub(start).Seconds()
	run.CreatesPerS = float64(o.N) / run.CreateSeconds
	run.LeadMarginMs = ms(due.Sub(created))
	progress("%d replicas: %.0f creates/s; due in %v", replicas, run.CreatesPerS, time.Until(due).Round(time.Millisecond))

	// The fire phase: from just before the due time (when the creates
	// overran it, from their end) to the last arrival.
	if !backoff.Sleep(ctx, time.Until(due.Add(-fireMargin))) {
		return nil, ctx.Err()
	}
	changes1, shards1, err := f.changes(ctx)
	if err != nil {
		return nil, err
	}
	fireStart := time.Now()
	profiles.start("fire")
	cpu2 := f.cpu()
	for i, p := range f.replicas {
		d := changes1[i] - changes0[i]
		run.Changes = append(run.Changes, ReplicaChanges{Name: p.id, Changes: d, PerCreate: float64(d) / float64(o.N),
			ShardsBefore: shards0[i], ShardsAfter: shards1[i]})
	}
	var serverCreate, serverIdle float64
	for _, sv := range f.servers {
		serverCreate += cpuDelta(cpu0, cpu1, sv.Name())
		serverIdle += cpuDelta(cpu1, cpu2, sv.Name())
	}
	run.ServerCPUPerCreateUs = serverCreate / float64(o.N) * 1e6
	if idle := fireStart.Sub(created).Seconds(); idle > 0 {
		run.ServerIdleCores = serverIdle / idle
	}
	giveUp := time.NewTimer(time.Until(due.Add(fireGiveUp + time.Duration(o.N)*time.Millisecond)))
	defer giveUp.Stop()
	select {
	case <-inbox.all:
	case <-giveUp.C:
		progress("%d replicas: gave up waiting for fires", replicas)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	cpu3 := f.cpu()
	fireEnd := time.Now()
	run.FireSeconds = fireEnd.Sub(fireStart).Seconds()
	run.LatenessMs, run.FiresPerS, run.Missed, run.Duplicates = inbox.summary()
	progress("%d replicas: %.0f fires/s, p50 %.1f ms, p99 %.1f ms, %d missed; waiting for the record updates", replicas, run.FiresPerS, run.LatenessMs.P50, run.LatenessMs.P99, run.Missed)

	arrived := int64(o.N - run.Missed)
	var done bool
	if run.Applied, done, err = waitApplied(ctx, f.replicas, arrived, recordsBound); err != nil {
		return nil, err
	}
	cpu4 := f.cpu()
	run.RecordsSeconds = time.Since(fireEnd).Seconds()
	if done {
		run.AppliedPerS = float64(arrived) / time.Since(due).Seconds()
	} else {
		progress("%d replicas: %d of %d records updated after %v", replicas, run.Applied, arrived, recordsBound)
	}
	for _, p := range cpu0 {
		run.CPU = append(run.CPU, ProcCPU{
			Name:     p.name,
			CreateS:  cpuDelta(cpu0, cpu1, p.name),
			FireS:    cpuDelta(cpu2, cpu3, p.name),
			RecordsS: cpuDelta(cpu3, cpu4, p.name),
		})
	}
	return run, nil
}

// changes reads each replica's chime_scheduler_changes_total (every
// bucket's summed) and chime_shards_held, in replica order.
func (f *fleet) changes(ctx context.Context) (changes []int64, shards []int, err error) {
	for _, p := range f.replicas {
		m, err := scrape(ctx, p.httpAddr)
		if err != nil {
			return nil, nil, err
		}
		changes = append(changes, int64(m[metricChanges]))
		shards = append(shards, int(m[metricShards]))
	}
	return changes, shards, nil
}

// waitShardsStable polls each replica's chime_shards_held until none
// changed for stable, or bound passes (false). A replica that cannot be
// scraped counts as a change.
func waitShardsStable(ctx context.Context, ps []*replicaProc, stable, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	var last []float64
	since := time.Now()
	for {
		var now []float64
		for _, p := range ps {
			m, err := scrape(ctx, p.httpAddr)
			if err != nil {
				m = map[string]float64{metricShards: -1}
			}
			now = append(now, m[metricShards])
		}
		if !slices.Equal(now, last) {
			last, since = now, time.Now()
		} else if time.Since(since) >= stable {
			return true
		}
		if time.Now().After(deadline) || !backoff.Sleep(ctx, pollEvery) {
			return false
		}
	}
}

// waitApplied polls the replicas until their chime_timer_fires_applied_total
// sums to want, or bound passes; it returns the last sum.
func waitApplied(ctx context.Context, ps []*replicaProc, want int64, bound time.Duration) (int64, bool, error) {
	deadline := time.Now().Add(bound)
	for {
		var sum int64
		for _, p := range ps {
			m, err := scrape(ctx, p.httpAddr)
			if err != nil {
				return 0, false, err
			}
			sum += int64(m[metricApplied])
		}
		if sum >= want {
			return sum, true, nil
		}
		if time.Now().After(deadline) {
			return sum, false, nil
		}
		if !backoff.Sleep(ctx, pollEvery) {
			return 0, false, ctx.Err()
		}
	}
}

// createTimers creates n timers with `clients` requests in flight, the ith
// for agent(i), each due in dueMs() milliseconds as it is sent. Any failure
// ends the run: with quotas off on loopback, none is expected.
func createTimers(ctx context.Context, conns []*nats.Conn, n, clients int, agent func(int) string, dueMs func() int64) error {
	g, gctx := errgroup.WithContext(ctx)
	var next atomic.Int64
	for c := range clients {
		nc := conns[c%len(conns)]
		g.Go(func() error {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return nil
				}
				body := []byte(`{"duration_ms":` + strconv.FormatInt(dueMs(), 10) + `}`)
				rctx, cancel := context.WithTimeout(gctx, createTimeout)
				msg, err := nc.RequestWithContext(rctx, subjects.Agent(agent(i), subjects.ActionTimerCreate), body)
				cancel()
				if err != nil {
					return fmt.Errorf("create %d: %w", i, err)
				}
				var t timers.Timer
				if err := subjects.DecodeReply(msg.Data, &t); err != nil {
					return fmt.Errorf("create %d: %w", i, err)
				}
			}
		})
	}
	return g.Wait()
}

func connectN(url string, n int, name string) ([]*nats.Conn, func(), error) {
	var conns []*nats.Conn
	closeAll := func() {
		for _, nc := range conns {
			nc.Close()
		}
	}
	for range n {
		nc, err := nats.Connect(url, nats.Name(name))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("connect: %w", err)
		}
		conns = append(conns, nc)
	}
	return conns, closeAll, nil
}

// progressf returns a line printer to w, safe for concurrent use (profiles
// report from their own goroutines).
func progressf(w io.Writer, name string) func(string, ...any) {
	var mu sync.Mutex
	return func(format string, args ...any) {
		if w != nil {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(w, name+": "+format+"\n", args...)
		}
	}
}

func jsReplicasFor(servers int) int {
	if servers > 1 {
		return clusterReplica
	}
	return 1
}

// fleet is one measurement's processes: fresh nats-servers and chime
// replicas in a work dir of their own.
type fleet struct {
	work     *workDir
	servers  []*natsproc.Server
	cluster  *natsproc.ClusterT
	replicas []*replicaProc
	progress func(string, ...any)
}

type fleetOptions struct {
	servers, replicas int
	pprof             bool // each replica serves /debug/pprof (CHIME_PPROF_ADDR)
	exe               string
	env               []string // added to each replica's environment
	progress          func(string, ...any)
}

// startFleet starts the nats-servers, then the replicas one after the other
// (the first provisions the streams and buckets), each ready before the
// next, as chime-bench chaos does. On error everything started is stopped.
func startFleet(ctx context.Context, o fleetOptions) (f *fleet, err error) {
	f = &fleet{progress: o.progress}
	if f.work, err = newWorkDir(o.progress); err != nil {
		return nil, err
	}
	started := f // f is nil by the time a failure's return runs this
	defer func() {
		if err != nil {
			started.close(true)
		}
	}()
	begin := time.Now()
	if o.servers == 1 {
		var s *natsproc.Server
		if s, err = f.work.standalone(); err == nil {
			f.servers = []*natsproc.Server{s}
		}
	} else if f.cluster, err = f.work.cluster(ctx, o.servers, nil); err == nil {
		f.servers = f.cluster.Servers
	}
	if err != nil {
		return nil, fmt.Errorf("nats-server: %w", err)
	}
	ports, err := natsproc.FreePorts(2 * o.replicas)
	if err != nil {
		return nil, err
	}
	for i := range o.replicas {
		p := &replicaProc{id: fmt.Sprintf("r%d", i+1), httpAddr: fmt.Sprintf("127.0.0.1:%d", ports[i]), exe: o.exe}
		if o.pprof {
			p.pprofAddr = fmt.Sprintf("127.0.0.1:%d", ports[o.replicas+i])
		}
		p.logPath = filepath.Join(f.work.dir, p.id+".log")
		// Later entries win: the run's own settings over the caller's.
		p.env = append(os.Environ(),
			"CHIME_NATS_URL="+f.urls(),
			fmt.Sprintf("CHIME_JS_REPLICAS=%d", jsReplicasFor(o.servers)),
			"CHIME_HTTP_ADDR="+p.httpAddr,
			"CHIME_REPLICA_ID="+p.id,
			"CHIME_PPROF_ADDR="+p.pprofAddr,
		)
		p.env = append(p.env, o.env...)
		f.work.Cleanup(p.kill)
		f.replicas = append(f.replicas, p)
		if err := p.start(); err != nil {
			return nil, err
		}
		if err := p.waitReady(ctx, replicaReady); err != nil {
			return nil, err
		}
	}
	o.progress("%d nats-server(s) and %d replicas ready in %v (work dir %s)", len(f.servers), o.replicas, time.Since(begin).Round(time.Millisecond), f.work.dir)
	return f, nil
}

func (f *fleet) urls() string {
	if f.cluster != nil {
		return f.cluster.URLs()
	}
	return f.servers[0].ClientURL()
}

// close stops every process, replicas first; the work dir (stores and
// logs) is kept when the measurement failed.
func (f *fleet) close(keep bool) {
	f.work.close()
	if keep {
		f.progress("work dir kept: %s", f.work.dir)
		return
	}
	_ = os.RemoveAll(f.work.dir)
}

// procTime is one process's CPU time so far.
type procTime struct {
	name string
	cpu  time.Duration // zero when it could not be read (not running)
}

// cpu reads the CPU time of each replica, each nats-server and the bench.
func (f *fleet) cpu() []procTime {
	var out []procTime
	for _, p := range f.replicas {
		out = append(out, procTime{p.id, procCPU(p.pid())})
	}
	for _, s := range f.servers {
		out = append(out, procTime{s.Name(), procCPU(s.Pid())})
	}
	out = append(out, procTime{"bench", procCPU(os.Getpid())})
	return append(out, procTime{"machine", machineCPU()})
}

// machineCPU is the busy time of every CPU of the machine, from the first
// line of /proc/stat: user, nice, system, irq, softirq and steal (not
// idle and iowait), zero when it cannot be read.
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fs := strings.Fields(line)
	if len(fs) < 9 || fs[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseInt(fs[i], 10, 64)
		if err != nil {
			return 0
		}
		busy += v
	}
	return time.Duration(busy) * time.Second / clockTicks
}

func cpuDelta(from, to []procTime, name string) float64 {
	var a, b time.Duration
	for _, p := range from {
		if p.name == name {
			a = p.cpu
		}
	}
	for _, p := range to {
		if p.name == name {
			b = p.cpu
		}
	}
	if a == 0 || b == 0 {
		return 0
	}
	return (b - a).Seconds()
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux build that matters, and Go has no sysconf to ask.
const clockTicks = 100

// procCPU is the user plus system CPU time of pid from /proc/<pid>/stat,
// zero when it cannot be read.
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count fields from the last ')'. utime and stime are fields 14 and 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	fs := strings.Fields(string(b[i+1:]))
	if len(fs) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(fs[11], 10, 64)
	st, err2 := strconv.ParseInt(fs[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(ut+st) * time.Second / clockTicks
}

// WriteText prints a row per replica count, then each one's CPU use.
func (r *ScaleResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "scale: servers=%d (streams R%d) partitions=%d n=%d agents=%d in-flight=%d lead=%dms\n", r.Servers, r.JSReplicas, r.Partitions, r.N, r.Agents, r.Clients, r.LeadMs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "replicas\tcreates/s\tfires/s\tp50 ms\tp99 ms\tmax ms\tmissed\tdups\trecorded/s\tlead margin ms\t")
	for _, x := range r.Runs {
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%d\t%d\t%.0f\t%.0f\t\n", x.Replicas, x.CreatesPerS, x.FiresPerS,
			x.LatenessMs.P50, x.LatenessMs.P99, x.LatenessMs.Max, x.Missed, x.Duplicates, x.AppliedPerS, x.LeadMarginMs)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "recorded/s: fires whose record was updated, per second from the due time to the last update")
	fmt.Fprintln(w, "per create: timer/wait changes each replica's scheduler received and decoded (chime_scheduler_changes_total); nats-server CPU in the create phase (idle: servers' cores busy between the creates and the due time):")
	for _, x := range r.Runs {
		var c strings.Builder
		for _, p := range x.Changes {
			fmt.Fprintf(&c, " %s %.3f", p.Name, p.PerCreate)
			if p.ShardsBefore != p.ShardsAfter {
				fmt.Fprintf(&c, " (shards %d->%d: moved during the creates)", p.ShardsBefore, p.ShardsAfter)
			} else {
				fmt.Fprintf(&c, " (%d shards)", p.ShardsAfter)
			}
		}
		fmt.Fprintf(w, "  %d replicas: changes/create%s; nats-server cpu %.1f us/create (idle %.3f cores)\n", x.Replicas, c.String(), x.ServerCPUPerCreateUs, x.ServerIdleCores)
	}
	fmt.Fprintln(w, "cpu seconds per phase (phase wall time in brackets; cores busy = cpu s / wall s; machine = every process on the host):")
	for _, x := range r.Runs {
		var c, f, rec strings.Builder
		for _, p := range x.CPU {
			fmt.Fprintf(&c, " %s %.2f", p.Name, p.CreateS)
			fmt.Fprintf(&f, " %s %.2f", p.Name, p.FireS)
			fmt.Fprintf(&rec, " %s %.2f", p.Name, p.RecordsS)
		}
		fmt.Fprintf(w, "  %d replicas:\n    create [%.2fs]:%s\n    fire [%.2fs]:%s\n    records [%.2fs]:%s\n",
			x.Replicas, x.CreateSeconds, c.String(), x.FireSeconds, f.String(), x.RecordsSeconds, rec.String())
	}
}
