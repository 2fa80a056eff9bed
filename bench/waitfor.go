package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/waitfor"
)

// WaitForOptions configures a WaitFor benchmark.
type WaitForOptions struct {
	N       int // registrations, each on its own task
	Agents  int // agents they belong to
	Clients int // concurrent requesting clients
	// Rate paces the task results, per second (0: as fast as the clients
	// go, which measures wakes behind a saturated replica).
	Rate    float64
	NATSURL string
	Log     *slog.Logger
}

// Validate checks the options.
func (o *WaitForOptions) Validate() error {
	switch {
	case o.N <= 0:
		return errors.New("bench: -n must be positive")
	case o.Agents <= 0:
		return errors.New("bench: --agents must be positive")
	case o.Clients <= 0:
		return errors.New("bench: -c must be positive")
	case o.Rate < 0:
		return errors.New("bench: --rate must not be negative")
	}
	return nil
}

// WaitForResult is what a WaitFor benchmark measured.
type WaitForResult struct {
	N      int     `json:"n"`
	Agents int     `json:"agents"`
	Rate   float64 `json:"rate,omitempty"`
	// RegistrationsPerS: task.start plus wait.for, per second.
	RegistrationsPerS float64 `json:"registrations_per_s"`
	// ResultsPerS: task.result requests answered per second.
	ResultsPerS float64 `json:"results_per_s"`
	// WakeMs: each wait_woken's arrival minus its task_result's, both as
	// the agent's subscriber sees them.
	WakeMs Latency `json:"wake_to_inbox_ms"`
	// StoredMs: the same, as the inbox stream stored them (its message
	// timestamps): chime's own path, free of the subscriber's scheduling.
	StoredMs Latency `json:"stored_wake_ms"`
	// WakesPerS: wait_woken arrivals per second, first result to last wake.
	WakesPerS    float64 `json:"wakes_per_s"`
	Missed       int     `json:"missed"`
	Duplicates   int     `json:"duplicates"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
}

// WaitFor runs the benchmark: N tasks across the agents, a silent
// task_result WaitFor on each (its own work item, so none replaces
// another), then every task's result, while the agents' subscriber times
// each wake from its result.
func WaitFor(ctx context.Context, o WaitForOptions) (*WaitForResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	url, _, stop, err := target(ctx, o.NATSURL, "", false, o.Log)
	if err != nil {
		return nil, err
	}
	defer stop()
	nc, err := nats.Connect(url, nats.Name("chime-bench"))
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer nc.Close()
	run := fmt.Sprintf("wf%d", time.Now().UnixNano()%1e9)

	var mu sync.Mutex
	results := make(map[string]time.Time, o.N) // task ID -> its task_result's arrival
	wakes := make(map[string]time.Time, o.N)   // task ID -> its wait_woken's arrival
	dups := 0
	done := make(chan struct{})
	subc, err := nats.Connect(url, nats.Name("chime-bench inbox"))
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer subc.Close()
	sub, err := subc.Subscribe("agent.*.inbox", func(m *nats.Msg) {
		at := time.Now()
		if !strings.HasPrefix(m.Subject, "agent."+run) {
			return
		}
		var env subjects.Envelope
		if json.Unmarshal(m.Data, &env) != nil {
			return
		}
		var task string
		seen := results
		switch env.Kind {
		case subjects.KindTaskResult:
			task = env.Source.ID
		case subjects.KindWaitWoken:
			var d waitfor.WaitWokenData
			if json.Unmarshal(env.Data, &d) != nil {
				return
			}
			task, seen = d.Resource, wakes
		default:
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if _, ok := seen[task]; ok {
			dups++
			return
		}
		seen[task] = at
		if len(wakes) == o.N {
			close(done)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("bench: subscribe: %w", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	defer func() { _ = sub.Unsubscribe() }()
	if err := subc.Flush(); err != nil {
		return nil, fmt.Errorf("bench: flush: %w", err)
	}

	clients := make([]*client.Client, o.Agents)
	for i := range clients {
		if clients[i], err = client.New(nc, fmt.Sprintf("%s-%d", run, i)); err != nil {
			return nil, err
		}
	}
	taskID := func(i int) string { return fmt.Sprintf("t%d", i) }
	each := func(rate float64, f func(ctx context.Context, c *client.Client, i int) error) (time.Duration, error) {
		start := time.Now()
		g, gctx := errgroup.WithContext(ctx)
		for w := range o.Clients {
			g.Go(func() error {
				for i := w; i < o.N; i += o.Clients {
					if rate > 0 { // request i is due i/rate after the start
						if wait := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); wait > 0 {
							select {
							case <-time.After(wait):
							case <-gctx.Done():
								return gctx.Err()
							}
						}
					}
					if err := f(gctx, clients[i%o.Agents], i); err != nil {
						return err
					}
				}
				return nil
			})
		}
		err := g.Wait()
		return time.Since(start), err
	}
	res := &WaitForResult{N: o.N, Agents: o.Agents, Rate: o.Rate}
	took, err := each(0, func(ctx context.Context, c *client.Client, i int) error {
		if _, err := c.StartTask(ctx, taskID(i), ""); err != nil {
			return fmt.Errorf("bench: task.start: %w", err)
		}
		r, err := c.WaitFor(ctx, waitfor.WaitForRequest{Wake: "task_result", Resource: taskID(i), Reason: "bench", Delivery: "silent", WorkItemID: taskID(i)})
		if err != nil {
			return fmt.Errorf("bench: wait.for: %w", err)
		}
		if r.Continuation != waitfor.YieldAndWait {
			return fmt.Errorf("bench: wait.for on a running task answered %s", r.Continuation)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.RegistrationsPerS = float64(o.N) / took.Seconds()
	out := "ok"
	if took, err = each(o.Rate, func(ctx context.Context, c *client.Client, i int) error {
		_, err := c.ReportResult(ctx, tasks.TaskResultRequest{TaskID: taskID(i), Status: tasks.TaskCompleted, Output: &out})
		if err != nil {
			return fmt.Errorf("bench: task.result: %w", err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	res.ResultsPerS = float64(o.N) / took.Seconds()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	var first, last time.Time
	for task, woke := range wakes {
		if r, ok := results[task]; ok {
			lat = append(lat, woke.Sub(r))
			if first.IsZero() || r.Before(first) {
				first = r
			}
		}
		if woke.After(last) {
			last = woke
		}
	}
	res.WakeMs = summarize(lat)
	if span := last.Sub(first).Seconds(); span > 0 {
		res.WakesPerS = float64(len(wakes)) / span
	}
	res.Missed, res.Duplicates = o.N-len(wakes), dups
	if res.StoredMs, err = storedWakes(ctx, nc, run, o.N); err != nil {
		return nil, err
	}
	res.PeakRSSBytes = peakRSS()
	return res, nil
}

// WriteText prints the result.
func (r *WaitForResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "waitfor: n=%d agents=%d", r.N, r.Agents)
	if r.Rate > 0 {
		fmt.Fprintf(w, " results paced at %.0f/s", r.Rate)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "registrations/s (task.start + wait.for): %.0f  results/s: %.0f\n", r.RegistrationsPerS, r.ResultsPerS)
	fmt.Fprintf(w, "task_result to wait_woken ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", r.WakeMs.P50, r.WakeMs.P90, r.WakeMs.P99, r.WakeMs.Max)
	fmt.Fprintf(w, "  as stored in the inbox stream: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", r.StoredMs.P50, r.StoredMs.P90, r.StoredMs.P99, r.StoredMs.Max)
	fmt.Fprintf(w, "wakes/s: %.0f  missed: %d  duplicates: %d\n", r.WakesPerS, r.Missed, r.Duplicates)
	fmt.Fprintf(w, "peak rss: %.1f MiB\n", float64(r.PeakRSSBytes)/(1<<20))
}

// Err fails the run when a wake was missed or delivered twice.
func (r *WaitForResult) Err() error {
	if r.Missed > 0 || r.Duplicates > 0 {
		return fmt.Errorf("bench: waitfor: %d missed, %d duplicated", r.Missed, r.Duplicates)
	}
	return nil
}

// storedWakes reads the run's task_result and wait_woken envelopes back
// from the inbox stream and times each wake by the stream's own clock.
func storedWakes(ctx context.Context, nc *nats.Conn, run string, n int) (Latency, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return Latency{}, fmt.Errorf("bench: %w", err)
	}
	c, err := js.OrderedConsumer(ctx, engine.InboxStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"agent.*.inbox"}})
	if err != nil {
		return Latency{}, fmt.Errorf("bench: read the inbox: %w", err)
	}
	results, wakes := make(map[string]time.Time, n), make(map[string]time.Time, n)
	for left := c.CachedInfo().NumPending; left > 0; {
		batch, err := c.Fetch(int(min(left, 4096)), jetstream.FetchContext(ctx))
		if err != nil {
			return Latency{}, fmt.Errorf("bench: read the inbox: %w", err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return Latency{}, fmt.Errorf("bench: read the inbox: %w", err)
			}
			left = md.NumPending
			if !strings.HasPrefix(m.Subject(), "agent."+run) {
				continue
			}
			var env subjects.Envelope
			if json.Unmarshal(m.Data(), &env) != nil {
				continue
			}
			switch env.Kind {
			case subjects.KindTaskResult:
				results[env.Source.ID] = md.Timestamp
			case subjects.KindWaitWoken:
				var d waitfor.WaitWokenData
				if json.Unmarshal(env.Data, &d) == nil {
					wakes[d.Resource] = md.Timestamp
				}
			}
		}
		if err := batch.Error(); err != nil {
			return Latency{}, fmt.Errorf("bench: read the inbox: %w", err)
		}
	}
	var lat []time.Duration
	for task, woke := range wakes {
		if r, ok := results[task]; ok {
			lat = append(lat, woke.Sub(r))
		}
	}
	return summarize(lat), nil
}
