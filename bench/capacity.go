package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/chime-nats/chime/internal/backoff"
)

// CapacityOptions configures a capacity run: for each replica count, fresh
// nats-servers and that many chime replicas, far-future timers created over
// many agents, what each replica then holds and the memory it takes, and
// the takeover after one replica is SIGKILLed.
type CapacityOptions struct {
	Servers  int   // 1: a standalone nats-server; 3-5: a JetStream cluster, chime's streams at R3
	Replicas []int // replica counts, each measured on its own fresh NATS
	Timers   int   // one-shot timers created, due in an hour
	Agents   int   // agents they are spread over
	Clients  int   // creates in flight
	// Stable is how long every replica's chime_timers_active must stay
	// unchanged before it counts as settled; Takeover bounds the wait for
	// the survivors after the kill.
	Stable   time.Duration
	Takeover time.Duration
	Settle   time.Duration // waited after the counts settle, before memory is read
	Exe      string        // the chime binary run as `serve`; default chime beside this binary, else on PATH
	Progress io.Writer
}

// Validate checks the options.
func (o *CapacityOptions) Validate() error {
	switch {
	case o.Servers != 1 && (o.Servers < 3 || o.Servers > 5):
		return errors.New("bench: --servers must be 1 (standalone) or 3-5 (a cluster)")
	case len(o.Replicas) == 0:
		return errors.New("bench: --replicas must name at least one replica count")
	case o.Timers <= 0:
		return errors.New("bench: --timers must be positive")
	case o.Agents <= 0:
		return errors.New("bench: --agents must be positive")
	case o.Clients <= 0:
		return errors.New("bench: -c must be positive")
	case o.Stable <= 0 || o.Takeover <= 0 || o.Settle < 0:
		return errors.New("bench: --stable and --takeover must be positive, --settle not negative")
	}
	for _, r := range o.Replicas {
		if r < 1 {
			return fmt.Errorf("bench: --replicas: %d is not a positive replica count", r)
		}
	}
	return nil
}

// CapacityResult is a capacity run: one CapacityRun per replica count.
type CapacityResult struct {
	Servers    int           `json:"servers"`
	JSReplicas int           `json:"js_replicas"`
	Timers     int           `json:"timers"`
	Agents     int           `json:"agents"`
	Runs       []CapacityRun `json:"runs"`
}

// CapacityRun is what one replica count measured.
type CapacityRun struct {
	Replicas    int     `json:"replicas"`
	CreatesPerS float64 `json:"creates_per_s"`
	// HeldSum is the sum of the replicas' chime_timers_active once each
	// count stayed unchanged for the stable time; Settled is false when
	// that did not happen within the bound (the sum is then the last read).
	HeldSum      int64             `json:"held_sum"`
	Settled      bool              `json:"settled"`
	SettleS      float64           `json:"settle_s"` // end of creates to settled
	PerReplica   []CapacityReplica `json:"per_replica"`
	TakeoverKill *CapacityTakeover `json:"takeover,omitempty"` // R >= 2 only
}

// CapacityReplica is one replica's memory, idle and holding its timers.
type CapacityReplica struct {
	Name          string  `json:"name"`
	Held          int64   `json:"held"`   // chime_timers_active
	Shards        int64   `json:"shards"` // chime_shards_held; 0 where not served
	IdleRSSBytes  int64   `json:"idle_rss_bytes"`
	IdleHeapBytes int64   `json:"idle_heap_bytes"`
	RSSBytes      int64   `json:"rss_bytes"`
	HeapBytes     int64   `json:"heap_bytes"` // go_memstats_heap_inuse_bytes
	RSSPerHeld    float64 `json:"rss_per_held_bytes"`
	HeapPerHeld   float64 `json:"heap_per_held_bytes"`
}

// CapacityTakeover is what followed the SIGKILL of one replica.
type CapacityTakeover struct {
	Killed string `json:"killed,omitempty"` // empty: nothing was killed
	// Reached: the survivors' sum of chime_timers_active came back to the
	// total, after TakeoverS; otherwise SurvivorSum is its last value.
	Reached     bool    `json:"reached"`
	TakeoverS   float64 `json:"takeover_s"`
	BoundS      float64 `json:"bound_s"` // how long it was waited for at most
	SurvivorSum int64   `json:"survivor_sum"`
	// SurvivorsBefore is the survivors' sum just before the kill: at or
	// above the total, every replica held every timer, nothing was killed
	// and there was no takeover to time.
	SurvivorsBefore int64 `json:"survivors_before"`
	// ShardLoads is each survivor's chime_shard_load_seconds gained from
	// the kill to the end of the wait; absent when the metric is not served.
	ShardLoads []ShardLoad `json:"shard_loads,omitempty"`
}

// ShardLoad is one survivor's shard loads during the takeover.
type ShardLoad struct {
	Name     string  `json:"name"`
	Loads    float64 `json:"loads"`     // histogram count gained
	SumS     float64 `json:"sum_s"`     // histogram sum gained
	AllCount float64 `json:"all_count"` // histogram count since start, start's loads included
}

// Metric names read from a replica's /metrics.
const (
	metricActive     = "chime_timers_active"
	metricApplied    = "chime_timer_fires_applied_total"
	metricChanges    = "chime_scheduler_changes_total"
	metricShards     = "chime_shards_held"
	metricRSS        = "process_resident_memory_bytes"
	metricHeap       = "go_memstats_heap_inuse_bytes"
	metricShardSum   = "chime_shard_load_seconds_sum"
	metricShardCount = "chime_shard_load_seconds_count"
)

const (
	capacityDue  = time.Hour // far enough that nothing fires during the run
	pollEvery    = 100 * time.Millisecond
	settleBound  = 2 * time.Minute // for every replica's count to be stable
	idleSettle   = 3 * time.Second // after ready, before idle memory is read
	scrapeBudget = 5 * time.Second
)

// Capacity runs the capacity measurements, one replica count after the
// other, each on fresh nats-servers.
func Capacity(ctx context.Context, o CapacityOptions) (*CapacityResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var err error
	if o.Exe, err = ownExe(o.Exe); err != nil {
		return nil, err
	}
	res := &CapacityResult{Servers: o.Servers, JSReplicas: jsReplicasFor(o.Servers), Timers: o.Timers, Agents: o.Agents}
	res.Runs, err = forEachCount(o.Replicas, func(r int) (*CapacityRun, error) { return capacityOne(ctx, o, r) })
	if err != nil {
		return nil, err
	}
	return res, nil
}

func capacityOne(ctx context.Context, o CapacityOptions, replicas int) (run *CapacityRun, err error) {
	progress := progressf(o.Progress, "capacity")
	f, err := startFleet(ctx, fleetOptions{
		servers: o.Servers, replicas: replicas, exe: o.Exe, progress: progress,
		env: []string{"CHIME_CREATE_RATE=0", "CHIME_MAX_TIMERS_PER_AGENT=0"},
	})
	if err != nil {
		return nil, err
	}
	defer func() { f.close(err != nil) }()
	conns, closeConns, err := connectN(f.urls(), scaleConns, "chime-bench capacity")
	if err != nil {
		return nil, err
	}
	defer closeConns()

	run = &CapacityRun{Replicas: replicas}
	if !backoff.Sleep(ctx, idleSettle) {
		return nil, ctx.Err()
	}
	for _, p := range f.replicas {
		m, err := scrape(ctx, p.httpAddr)
		if err != nil {
			return nil, err
		}
		run.PerReplica = append(run.PerReplica, CapacityReplica{Name: p.id, IdleRSSBytes: int64(m[metricRSS]), IdleHeapBytes: int64(m[metricHeap])})
	}

	prefix := fmt.Sprintf("c%d-%d", replicas, time.Now().UnixNano()%1e6)
	progress("%d replicas: creating %d timers due in %v over %d agents, %d in flight", replicas, o.Timers, capacityDue, o.Agents, o.Clients)
	start := time.Now()
	err = createTimers(ctx, conns, o.Timers, o.Clients, func(i int) string { return fmt.Sprintf("%s-%d", prefix, i%o.Agents) },
		func() int64 { return capacityDue.Milliseconds() })
	if err != nil {
		return nil, err
	}
	created := time.Now()
	run.CreatesPerS = float64(o.Timers) / created.Sub(start).Seconds()
	progress("%d replicas: %.0f creates/s; waiting for each replica's %s to hold still for %v", replicas, run.CreatesPerS, metricActive, o.Stable)

	counts, settled, err := waitStable(ctx, f.replicas, o.Stable, settleBound)
	if err != nil {
		return nil, err
	}
	run.Settled, run.SettleS = settled, time.Since(created).Seconds()-o.Stable.Seconds()
	for _, c := range counts {
		run.HeldSum += c
	}
	progress("%d replicas: held %v (sum %d, total %d); settling %v", replicas, counts, run.HeldSum, o.Timers, o.Settle)
	// No endpoint forces a GC: waiting lets the last allocations' garbage
	// go before the heap and RSS are read.
	if !backoff.Sleep(ctx, o.Settle) {
		return nil, ctx.Err()
	}
	for i, p := range f.replicas {
		m, err := scrape(ctx, p.httpAddr)
		if err != nil {
			return nil, err
		}
		pr := &run.PerReplica[i]
		pr.Held, pr.Shards, pr.RSSBytes, pr.HeapBytes = int64(m[metricActive]), int64(m[metricShards]), int64(m[metricRSS]), int64(m[metricHeap])
		if pr.Held > 0 {
			pr.RSSPerHeld = float64(pr.RSSBytes-pr.IdleRSSBytes) / float64(pr.Held)
			pr.HeapPerHeld = float64(pr.HeapBytes-pr.IdleHeapBytes) / float64(pr.Held)
		}
	}
	if replicas >= 2 {
		if run.TakeoverKill, err = takeover(ctx, f, int64(o.Timers), o.Takeover, progress); err != nil {
			return nil, err
		}
	}
	return run, nil
}

// waitStable polls each replica's chime_timers_active until none changed
// for stable, or bound passes (settled false), and returns the last counts.
func waitStable(ctx context.Context, ps []*replicaProc, stable, bound time.Duration) ([]int64, bool, error) {
	deadline := time.Now().Add(bound)
	last := make([]int64, len(ps))
	for i := range last {
		last[i] = -1
	}
	since := time.Now()
	for {
		changed := false
		for i, p := range ps {
			m, err := scrape(ctx, p.httpAddr)
			if err != nil {
				return nil, false, err
			}
			if c := int64(m[metricActive]); c != last[i] {
				last[i], changed = c, true
			}
		}
		if changed {
			since = time.Now()
		}
		if time.Since(since) >= stable {
			return last, true, nil
		}
		if time.Now().After(deadline) {
			return last, false, nil
		}
		if !backoff.Sleep(ctx, pollEvery) {
			return nil, false, ctx.Err()
		}
	}
}

// takeover SIGKILLs the last replica and waits, at most bound, until the
// survivors' chime_timers_active sum to the total.
func takeover(ctx context.Context, f *fleet, total int64, bound time.Duration, progress func(string, ...any)) (*CapacityTakeover, error) {
	victim, survivors := f.replicas[len(f.replicas)-1], f.replicas[:len(f.replicas)-1]
	before := make([]map[string]float64, len(survivors))
	for i, p := range survivors {
		m, err := scrape(ctx, p.httpAddr)
		if err != nil {
			return nil, err
		}
		before[i] = m
	}
	t := &CapacityTakeover{BoundS: bound.Seconds()}
	for _, m := range before {
		t.SurvivorsBefore += int64(m[metricActive])
	}
	if t.SurvivorsBefore >= total {
		// Every replica holds every timer (the build before sharding): the
		// survivors lack nothing, so there is no takeover to time.
		t.SurvivorSum = t.SurvivorsBefore
		progress("no takeover to time: the survivors already hold %d of %d", t.SurvivorsBefore, total)
		return t, nil
	}
	progress("SIGKILL %s; waiting up to %v for the survivors to hold %d", victim.id, bound, total)
	t.Killed = victim.id
	killed := time.Now()
	if err := victim.kill(); err != nil {
		return nil, err
	}
	deadline := killed.Add(bound)
	var after []map[string]float64
	for {
		after = after[:0]
		var sum int64
		for _, p := range survivors {
			m, err := scrape(ctx, p.httpAddr)
			if err != nil {
				return nil, err
			}
			after = append(after, m)
			sum += int64(m[metricActive])
		}
		t.SurvivorSum = sum
		if sum == total {
			t.Reached, t.TakeoverS = true, time.Since(killed).Seconds()
			break
		}
		if time.Now().After(deadline) {
			break
		}
		if !backoff.Sleep(ctx, pollEvery) {
			return nil, ctx.Err()
		}
	}
	for i, p := range survivors {
		c, ok := after[i][metricShardCount]
		if !ok {
			continue // not served by this build
		}
		t.ShardLoads = append(t.ShardLoads, ShardLoad{
			Name: p.id, AllCount: c,
			Loads: c - before[i][metricShardCount], SumS: after[i][metricShardSum] - before[i][metricShardSum],
		})
	}
	if t.Reached {
		progress("takeover: survivors hold %d after %.2fs", total, t.TakeoverS)
	} else {
		progress("takeover: not reached in %v; survivors hold %d", bound, t.SurvivorSum)
	}
	return t, nil
}

// scrape reads a replica's /metrics: each series' value by metric name,
// summed over its labels (one series for the metrics read here but the
// histograms', whose buckets are not read).
func scrape(ctx context.Context, addr string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeBudget)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", addr, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics of %s: %s", addr, res.Status)
	}
	return parseMetrics(res.Body)
}

// parseMetrics reads the Prometheus text format: `name{labels} value` or
// `name value`, an optional timestamp after.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		var name, rest string
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			name, rest = line[:i], line[j+1:]
		} else {
			name, rest, _ = strings.Cut(line, " ")
		}
		fs := strings.Fields(rest)
		if len(fs) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fs[0], 64)
		if err != nil {
			continue
		}
		if strings.HasSuffix(name, "_bucket") {
			continue
		}
		out[name] += v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return out, nil
}

// WriteText prints each replica count's replicas, a row each, and the
// takeover after the kill.
func (r *CapacityResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "capacity: servers=%d (streams R%d) timers=%d agents=%d\n", r.Servers, r.JSReplicas, r.Timers, r.Agents)
	const mib = 1 << 20
	for _, x := range r.Runs {
		settled := "stable"
		if !x.Settled {
			settled = "NOT stable"
		}
		fmt.Fprintf(w, "%d replicas: %.0f creates/s; held sum %d of %d (%s %.1fs after the creates)\n", x.Replicas, x.CreatesPerS, x.HeldSum, r.Timers, settled, x.SettleS)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  replica\tshards\theld\tidle rss MiB\trss MiB\tidle heap MiB\theap MiB\trss B/held\theap B/held\t")
		for _, p := range x.PerReplica {
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%.0f\t\n", p.Name, p.Shards, p.Held,
				float64(p.IdleRSSBytes)/mib, float64(p.RSSBytes)/mib, float64(p.IdleHeapBytes)/mib, float64(p.HeapBytes)/mib, p.RSSPerHeld, p.HeapPerHeld)
		}
		_ = tw.Flush()
		t := x.TakeoverKill
		if t == nil {
			continue
		}
		switch {
		case t.SurvivorsBefore >= int64(r.Timers):
			fmt.Fprintf(w, "  takeover: nothing to time; before any kill the survivors-to-be held %d of %d (every replica holds every timer)\n", t.SurvivorsBefore, r.Timers)
			continue
		case t.Reached:
			fmt.Fprintf(w, "  takeover (SIGKILL %s): survivors hold %d after %.2fs", t.Killed, t.SurvivorSum, t.TakeoverS)
		default:
			fmt.Fprintf(w, "  takeover (SIGKILL %s): not reached in %.0fs; survivors hold %d, not %d", t.Killed, t.BoundS, t.SurvivorSum, r.Timers)
		}
		if len(t.ShardLoads) == 0 {
			fmt.Fprintf(w, "; %s not served\n", strings.TrimSuffix(metricShardCount, "_count"))
			continue
		}
		fmt.Fprint(w, "; shard loads (concurrent):")
		for _, l := range t.ShardLoads {
			mean := 0.0
			if l.Loads > 0 {
				mean = l.SumS / l.Loads
			}
			fmt.Fprintf(w, " %s %.0f (%.3fs in all, %.3fs each on average)", l.Name, l.Loads, l.SumS, mean)
		}
		fmt.Fprintln(w)
	}
}
