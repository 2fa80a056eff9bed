package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
)

// TasksOptions configures the task output benchmark.
type TasksOptions struct {
	// OutputMiB is each task's output, appended in MaxAppendChunk parts.
	OutputMiB int
	// Concurrent is how many tasks of one agent append and report at once.
	Concurrent int
	// TimerEvery is how often another agent creates a one-shot timer, due
	// TimerLead later, for as long as the outputs go on.
	TimerEvery, TimerLead time.Duration
	// Embedded runs the replica with its embedded NATS server (its RSS
	// then holds the server's too); otherwise it connects to a nats-server
	// of its own, as the Helm chart deploys it.
	Embedded bool
	// Exe is the chime binary run as `serve`; default chime beside this
	// binary, else on PATH.
	Exe      string
	Env      []string // added to the replica's environment
	Progress io.Writer
}

// Validate checks the options.
func (o *TasksOptions) Validate() error {
	switch {
	case o.OutputMiB <= 0 || o.OutputMiB > tasks.MaxTaskOutput>>20:
		return fmt.Errorf("bench: --output-mib must be from 1 to %d", tasks.MaxTaskOutput>>20)
	case o.Concurrent <= 0:
		return errors.New("bench: --concurrent must be positive")
	case o.TimerEvery <= 0 || o.TimerLead <= 0:
		return errors.New("bench: --timer-every and --timer-lead must be positive")
	}
	return nil
}

// TasksResult is what the task output benchmark measured.
type TasksResult struct {
	OutputMiB  int  `json:"output_mib"`
	Concurrent int  `json:"concurrent"`
	Embedded   bool `json:"embedded_nats"`
	// BaseRSSBytes is the replica's RSS before the outputs; PeakRSSBytes
	// its VmHWM at the end (the whole run, start included).
	BaseRSSBytes int64 `json:"base_rss_bytes"`
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// AppendS is from the first append to the last; ResultS from the first
	// result (which assembles the output) to the last answered; ReadS
	// reading every output back over task.output.
	AppendS      float64 `json:"append_s"`
	AppendMiBPS  float64 `json:"append_mib_per_s"`
	ResultS      float64 `json:"result_s"`
	ReadS        float64 `json:"read_s"`
	ResultRetry  int     `json:"result_retries"`
	Verified     int     `json:"outputs_verified"`
	TimersFired  int     `json:"timers_fired"`
	TimersMissed int     `json:"timers_missed"`
	TimerFails   int     `json:"timer_create_failures"`
	// TimerLateMs is the other agent's timers: arrival minus due time.
	TimerLateMs Latency `json:"timer_lateness_ms"`
	// PhaseRSSBytes is the most RSS sampled (every 50 ms) in each phase:
	// append, results, read back.
	PhaseRSSBytes [3]int64 `json:"phase_max_rss_bytes"`
	// NotReady is how many /readyz polls (every 250 ms) answered not ready.
	NotReady int    `json:"readyz_not_ready"`
	Failure  string `json:"failure,omitempty"`
}

// Err reports a run whose outputs did not all come back intact.
func (r *TasksResult) Err() error {
	if r.Failure != "" {
		return errors.New(r.Failure)
	}
	return nil
}

// Tasks runs the benchmark against a `chime serve` child: Concurrent tasks
// of one agent each append OutputMiB of output and report it (chime then
// assembles it into the object store), and read it back, while another
// agent's timers fire; the child's peak RSS (VmHWM) and the timers'
// lateness are reported.
func Tasks(ctx context.Context, o TasksOptions) (*TasksResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	progress := progressf(o.Progress, "tasks")
	exe, err := ownExe(o.Exe)
	if err != nil {
		return nil, err
	}
	p, url, stop, err := tasksTarget(ctx, o, exe, progress)
	if err != nil {
		return nil, err
	}
	keep := true
	defer func() { stop(keep) }()

	nc, err := nats.Connect(url, nats.Name("chime-bench tasks"))
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer nc.Close()
	run := fmt.Sprintf("t%d", time.Now().UnixNano()%1e9)
	worker, err := client.New(nc, run+"-out")
	if err != nil {
		return nil, err
	}
	other, err := client.New(nc, run+"-timer")
	if err != nil {
		return nil, err
	}
	res := &TasksResult{OutputMiB: o.OutputMiB, Concurrent: o.Concurrent, Embedded: o.Embedded}
	pid := p.pid()
	res.BaseRSSBytes, _ = procMemory(pid)

	// The other agent's inbox, subscribed as an agent would.
	sub, err := nats.Connect(url, nats.Name("chime-bench tasks inbox"))
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer sub.Close()
	inbox := newArrivals(subjects.HeaderMsgID, 0)
	inbox.want = -1 // known at the end (expect)
	s, err := sub.Subscribe(subjects.Inbox(run+"-timer"), inbox.add)
	if err != nil {
		return nil, fmt.Errorf("bench: subscribe: %w", err)
	}
	s.SetPendingLimits(-1, -1)
	if err := sub.Flush(); err != nil {
		return nil, fmt.Errorf("bench: flush: %w", err)
	}

	bgCtx, bg := context.WithCancel(ctx)
	var bgDone sync.WaitGroup
	var notReady atomic.Int64
	bgDone.Go(func() { pollReady(bgCtx, p.httpAddr, &notReady) })
	var created, createFails atomic.Int64
	bgDone.Go(func() { timerLoad(bgCtx, other, o.TimerEvery, o.TimerLead, &created, &createFails) })

	var phase atomic.Int32
	bgDone.Go(func() { sampleRSS(bgCtx, pid, &phase, &res.PhaseRSSBytes) })
	progress("%d tasks of %d MiB each, appended and reported at once; a timer of another agent every %v", o.Concurrent, o.OutputMiB, o.TimerEvery)
	outErr := outputs(ctx, worker, o, res, &phase, progress)
	bg()
	bgDone.Wait()
	// The last timers are due TimerLead after their create.
	deadline := time.Now().Add(o.TimerLead + 10*time.Second)
	for inbox.count() < int(created.Load()) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	inbox.expect(int(created.Load()))
	res.TimerLateMs, _, res.TimersMissed, _ = inbox.summary()
	res.TimersFired = int(created.Load()) - res.TimersMissed
	res.TimerFails = int(createFails.Load())
	res.NotReady = int(notReady.Load())
	_, res.PeakRSSBytes = procMemory(pid)
	if outErr != nil {
		res.Failure = outErr.Error()
	} else {
		keep = false
	}
	return res, nil
}

// tasksTarget starts the replica: a `serve` child on an embedded server,
// or on a nats-server of its own; stop ends them (keeping the work dir
// when asked).
func tasksTarget(ctx context.Context, o TasksOptions, exe string, progress func(string, ...any)) (*replicaProc, string, func(keep bool), error) {
	if !o.Embedded {
		f, err := startFleet(ctx, fleetOptions{servers: 1, replicas: 1, exe: exe, progress: progress, env: o.Env})
		if err != nil {
			return nil, "", nil, err
		}
		return f.replicas[0], f.urls(), f.close, nil
	}
	w, err := newWorkDir(progress)
	if err != nil {
		return nil, "", nil, err
	}
	stop := func(keep bool) {
		w.close()
		if keep {
			progress("work dir kept: %s", w.dir)
			return
		}
		_ = os.RemoveAll(w.dir)
	}
	ports, err := natsproc.FreePorts(2)
	if err != nil {
		stop(true)
		return nil, "", nil, err
	}
	p := &replicaProc{id: "r1", httpAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), exe: exe, logPath: filepath.Join(w.dir, "r1.log")}
	listen := fmt.Sprintf("127.0.0.1:%d", ports[1])
	p.env = append(os.Environ(), "CHIME_NATS_URL=", "CHIME_DATA_DIR="+filepath.Join(w.dir, "data"), "CHIME_NATS_LISTEN="+listen,
		"CHIME_HTTP_ADDR="+p.httpAddr, "CHIME_REPLICA_ID=r1")
	p.env = append(p.env, o.Env...)
	w.Cleanup(p.kill)
	if err := p.start(); err != nil {
		stop(true)
		return nil, "", nil, err
	}
	if err := p.waitReady(ctx, replicaReady); err != nil {
		stop(true)
		return nil, "", nil, err
	}
	return p, "nats://" + listen, stop, nil
}

// outputs runs the tasks: start, append every part, report, read back.
func outputs(ctx context.Context, c *client.Client, o TasksOptions, res *TasksResult, phase *atomic.Int32, progress func(string, ...any)) error {
	size := int64(o.OutputMiB) << 20
	ids := make([]string, o.Concurrent)
	sums := make([][32]byte, o.Concurrent)
	for i := range ids {
		t, err := c.StartTask(ctx, "", fmt.Sprintf("bench output %d", i))
		if err != nil {
			return fmt.Errorf("start: %w", err)
		}
		ids[i] = t.ID
	}
	begin := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for i, id := range ids {
		g.Go(func() error {
			gen := outputGen(i)
			h := sha256.New()
			part := make([]byte, tasks.MaxAppendChunk)
			for seq, off := int64(0), int64(0); off < size; seq++ {
				n := min(int64(len(part)), size-off)
				gen.fill(part[:n])
				h.Write(part[:n])
				if err := retryUnavailable(gctx, func(ctx context.Context) error {
					_, err := c.AppendOutput(ctx, id, seq, part[:n])
					return err
				}, nil); err != nil {
					return fmt.Errorf("append %d of %s: %w", seq, id, err)
				}
				off += n
			}
			copy(sums[i][:], h.Sum(nil))
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	res.AppendS = time.Since(begin).Seconds()
	res.AppendMiBPS = float64(o.OutputMiB*o.Concurrent) / res.AppendS
	progress("appended %d MiB in %.1f s; reporting the results", o.OutputMiB*o.Concurrent, res.AppendS)

	phase.Store(1)
	begin = time.Now()
	var retries atomic.Int64
	g, gctx = errgroup.WithContext(ctx)
	for _, id := range ids {
		g.Go(func() error {
			return retryUnavailable(gctx, func(ctx context.Context) error {
				t, err := c.ReportResult(ctx, tasks.TaskResultRequest{TaskID: id, Status: tasks.TaskCompleted, OutputAppended: true})
				if err == nil && t.OutputSize != size {
					return fmt.Errorf("result of %s: output_size %d, want %d", id, t.OutputSize, size)
				}
				return err
			}, &retries)
		})
	}
	err := g.Wait()
	res.ResultS, res.ResultRetry = time.Since(begin).Seconds(), int(retries.Load())
	if err != nil {
		return err
	}
	progress("results stored in %.1f s (%d retried); reading the outputs back", res.ResultS, res.ResultRetry)

	phase.Store(2)
	begin = time.Now()
	var verified atomic.Int64
	g, gctx = errgroup.WithContext(ctx)
	for i, id := range ids {
		g.Go(func() error {
			h := sha256.New()
			var off int64
			for {
				var r tasks.TaskOutputReply
				body := []byte(`{"task_id":"` + id + `","offset":` + strconv.FormatInt(off, 10) + `}`)
				if err := retryUnavailable(gctx, func(ctx context.Context) error {
					return c.Request(ctx, tasks.ActionTaskOutput, body, &r)
				}, nil); err != nil {
					return fmt.Errorf("read %s at %d: %w", id, off, err)
				}
				h.Write(r.Data)
				off += int64(len(r.Data))
				if r.EOF || len(r.Data) == 0 {
					break
				}
			}
			if off != size || !bytes.Equal(h.Sum(nil), sums[i][:]) {
				return fmt.Errorf("output of %s read back differs: %d bytes, want %d", id, off, size)
			}
			verified.Add(1)
			return nil
		})
	}
	err = g.Wait()
	res.ReadS, res.Verified = time.Since(begin).Seconds(), int(verified.Load())
	return err
}

// retryUnavailable runs op with a 30 s deadline, again while it answers
// unavailable (chime's own request deadline passed), up to 5 times.
func retryUnavailable(ctx context.Context, op func(context.Context) error, retries *atomic.Int64) error {
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := op(actx)
		cancel()
		if !errors.Is(err, &subjects.Error{Code: subjects.CodeUnavailable}) || attempt == 5 {
			return err
		}
		if retries != nil {
			retries.Add(1)
		}
	}
}

// gen makes a task's output: pseudo-random bytes (not UTF-8, so stored
// in the object store whatever their size), the same for a seed.
type gen struct{ r *rand.ChaCha8 }

func outputGen(i int) *gen {
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(i)+1)
	return &gen{r: rand.NewChaCha8(seed)}
}

func (g *gen) fill(b []byte) { _, _ = g.r.Read(b) }

// timerLoad creates a one-shot timer every every, due lead later, until ctx
// ends; creates that fail are counted, not retried.
func timerLoad(ctx context.Context, c *client.Client, every, lead time.Duration, created, fails *atomic.Int64) {
	each(ctx, every, func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, err := c.CreateTimer(cctx, lead.Milliseconds(), 0, "")
		cancel()
		if err != nil {
			fails.Add(1)
			return
		}
		created.Add(1)
	})
}

// each calls fn every d until ctx ends.
func each(ctx context.Context, d time.Duration, fn func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fn()
		}
	}
}

// pollReady asks /readyz every 250 ms until ctx ends and counts the
// answers that are not 200.
func pollReady(ctx context.Context, addr string, notReady *atomic.Int64) {
	c := http.Client{Timeout: time.Second}
	each(ctx, 250*time.Millisecond, func() {
		res, err := c.Get("http://" + addr + "/readyz")
		if err != nil {
			notReady.Add(1)
			return
		}
		_ = res.Body.Close()
		if res.StatusCode != http.StatusOK {
			notReady.Add(1)
		}
	})
}

// sampleRSS reads pid's RSS every 50 ms until ctx ends, keeping the most
// of each phase.
func sampleRSS(ctx context.Context, pid int, phase *atomic.Int32, most *[3]int64) {
	each(ctx, 50*time.Millisecond, func() {
		rss, _ := procMemory(pid)
		if p := phase.Load(); rss > most[p] {
			most[p] = rss
		}
	})
}

// procMemory reads a process's current and peak resident set (VmRSS,
// VmHWM) from /proc/<pid>/status; zeros when it cannot.
func procMemory(pid int) (rss, hwm int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kib, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if name == "VmRSS" {
			rss = kib << 10
		} else {
			hwm = kib << 10
		}
	}
	return rss, hwm
}

// WriteText prints a result for people.
func (r *TasksResult) WriteText(w io.Writer) {
	where := "a nats-server of its own"
	if r.Embedded {
		where = "its embedded NATS server"
	}
	fmt.Fprintf(w, "task outputs: %d x %d MiB from one agent, at once; the replica on %s\n", r.Concurrent, r.OutputMiB, where)
	fmt.Fprintf(w, "append: %.1f s (%.1f MiB/s)  results: %.1f s (%d retried)  read back: %.1f s, %d of %d verified\n",
		r.AppendS, r.AppendMiBPS, r.ResultS, r.ResultRetry, r.ReadS, r.Verified, r.Concurrent)
	fmt.Fprintf(w, "replica rss: %.1f MiB before, peak (VmHWM) %.1f MiB; most sampled while appending %.1f, storing results %.1f, reading back %.1f MiB\n",
		float64(r.BaseRSSBytes)/(1<<20), float64(r.PeakRSSBytes)/(1<<20),
		float64(r.PhaseRSSBytes[0])/(1<<20), float64(r.PhaseRSSBytes[1])/(1<<20), float64(r.PhaseRSSBytes[2])/(1<<20))
	fmt.Fprintf(w, "other agent's timers: %d fired, %d missed, %d creates failed; lateness ms p50 %.2f  p99 %.2f  max %.2f\n",
		r.TimersFired, r.TimersMissed, r.TimerFails, r.TimerLateMs.P50, r.TimerLateMs.P99, r.TimerLateMs.Max)
	fmt.Fprintf(w, "/readyz not ready: %d polls\n", r.NotReady)
	if r.Failure != "" {
		fmt.Fprintf(w, "FAILED: %s\n", r.Failure)
	}
}

// count is how many distinct deliveries arrived.
func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.got)
}

// expect sets how many deliveries should come, once known.
func (a *arrivals) expect(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.want = n
}
