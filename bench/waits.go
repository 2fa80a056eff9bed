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
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

// WaitsOptions configures a wait benchmark.
type WaitsOptions struct {
	N       int           // waits to register
	Agents  int           // agents the waits belong to
	Clients int           // concurrent requesting clients
	Lead    time.Duration // first target after the start; must outlast the registrations
	Spread  time.Duration // targets spread evenly over this
	Timers  int           // timers fired once alone and once while the waits run; 0: none
	NATSURL string        // empty: run an in-process chime on an embedded server
	Log     *slog.Logger
}

// Validate checks the options.
func (o *WaitsOptions) Validate() error {
	switch {
	case o.N <= 0:
		return errors.New("bench: -n must be positive")
	case o.Agents <= 0:
		return errors.New("bench: --agents must be positive")
	case o.Clients <= 0:
		return errors.New("bench: -c must be positive")
	case o.Lead <= 0:
		return errors.New("bench: --lead must be positive")
	case o.Spread < 0:
		return errors.New("bench: --spread must not be negative")
	case o.Timers < 0:
		return errors.New("bench: --timers must not be negative")
	}
	return nil
}

// WaitsResult is what a wait benchmark measured.
type WaitsResult struct {
	N            int     `json:"n"`
	Agents       int     `json:"agents"`
	LeadMs       int64   `json:"lead_ms"`
	SpreadMs     int64   `json:"spread_ms"`
	RequestsPerS float64 `json:"requests_per_s"`
	// Completion: the wait_complete inbox delivery seen by the subscriber
	// minus the wait's target.
	LatenessMs Latency `json:"lateness_ms"`
	Missed     int     `json:"missed"`
	Duplicates int     `json:"duplicates"`
	// Progress messages per second while every wait was running, and the
	// rate one a second per wait would give.
	ProgressPerS  float64 `json:"progress_per_s"`
	ProgressIdeal float64 `json:"progress_ideal_per_s"`
	// Timer fires measured alone, then while the waits run.
	TimersAlone     *TimersResult `json:"timers_alone,omitempty"`
	TimersWithWaits *TimersResult `json:"timers_with_waits,omitempty"`
	PeakRSSBytes    int64         `json:"peak_rss_bytes"`
}

// Waits runs the benchmark: timers alone, then N until-waits from the
// agents with, once all are registered, the same timers again.
func Waits(ctx context.Context, o WaitsOptions) (*WaitsResult, error) {
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
	res := &WaitsResult{N: o.N, Agents: o.Agents, LeadMs: o.Lead.Milliseconds(), SpreadMs: o.Spread.Milliseconds()}
	timers := TimersOptions{N: o.Timers, Clients: 16, Lead: time.Second, Spread: 2 * time.Second, NATSURL: url, Log: o.Log}
	if o.Timers > 0 {
		if res.TimersAlone, err = Timers(ctx, timers); err != nil {
			return nil, err
		}
	}

	nc, err := nats.Connect(url, nats.Name("chime-bench"))
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer nc.Close()
	run := fmt.Sprintf("w%d", time.Now().UnixNano()%1e9)
	obs, err := observeWaits(nc, run, o.N)
	if err != nil {
		return nil, err
	}
	defer obs.stop()

	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for c := range o.Clients {
		g.Go(func() error {
			for i := c; i < o.N; i += o.Clients {
				due := start.Add(o.Lead + time.Duration(int64(o.Spread)*int64(i)/int64(o.N)))
				subject := subjects.Agent(fmt.Sprintf("%s-%d", run, i%o.Agents), waits.ActionWaitRequest)
				body, _ := json.Marshal(map[string]string{"until": subjects.FormatISO(due.UTC())})
				msg, err := nc.RequestWithContext(gctx, subject, body)
				if err != nil {
					return fmt.Errorf("bench: wait.request: %w", err)
				}
				var reply waits.WaitReply
				if err := subjects.DecodeReply(msg.Data, &reply); err != nil {
					return fmt.Errorf("bench: wait.request: %w", err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	registered := time.Now()
	res.RequestsPerS = float64(o.N) / registered.Sub(start).Seconds()
	firstDue := start.Add(o.Lead)
	if !registered.Before(firstDue) {
		return nil, fmt.Errorf("bench: registering took %v, longer than --lead %v: raise --lead", registered.Sub(start).Round(time.Millisecond), o.Lead)
	}
	progressFrom := obs.progress.Load()

	if o.Timers > 0 {
		if res.TimersWithWaits, err = Timers(ctx, timers); err != nil {
			return nil, err
		}
	}
	// Progress is counted while every wait runs: until the first is due.
	if window := time.Until(firstDue) - 100*time.Millisecond; window > 0 {
		select {
		case <-time.After(window):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	end := time.Now()
	if end.After(firstDue) {
		end = firstDue
	}
	if span := end.Sub(registered).Seconds(); span > 0.5 {
		res.ProgressPerS = float64(obs.progress.Load()-progressFrom) / span
	}
	res.ProgressIdeal = float64(o.N)

	select {
	case <-obs.all:
	case <-time.After(time.Until(start.Add(o.Lead+o.Spread)) + 10*time.Second):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	res.Missed = o.N - len(obs.lateness)
	res.Duplicates = obs.duplicates
	res.LatenessMs = summarize(obs.lateness)
	res.PeakRSSBytes = peakRSS()
	return res, nil
}

// waitObserver watches the run's agents as they would: their inbox for
// completions, their progress subject for the count.
type waitObserver struct {
	progress   atomic.Int64
	mu         sync.Mutex
	seen       map[string]int
	lateness   []time.Duration
	duplicates int
	all        chan struct{}
	subs       []*nats.Subscription
}

func observeWaits(nc *nats.Conn, run string, n int) (*waitObserver, error) {
	o := &waitObserver{seen: make(map[string]int, n), lateness: make([]time.Duration, 0, n), all: make(chan struct{})}
	inbox, err := nc.Subscribe("agent.*.inbox", func(m *nats.Msg) {
		now := time.Now()
		if !strings.HasPrefix(m.Subject, "agent."+run) {
			return
		}
		var env subjects.Envelope
		var data waits.WaitEndData
		if json.Unmarshal(m.Data, &env) != nil || env.Kind != subjects.KindWaitComplete || json.Unmarshal(env.Data, &data) != nil {
			return
		}
		due, err := waits.ParseUntil(data.TargetTime, time.UTC)
		if err != nil {
			return
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.seen[env.ID]++; o.seen[env.ID] > 1 {
			o.duplicates++
			return
		}
		o.lateness = append(o.lateness, now.Sub(due))
		if len(o.lateness) == n {
			close(o.all)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("bench: subscribe: %w", err)
	}
	o.subs = append(o.subs, inbox)
	progress, err := nc.Subscribe("agent.*."+waits.ActionWaitProgress, func(m *nats.Msg) {
		if strings.HasPrefix(m.Subject, "agent."+run) {
			o.progress.Add(1)
		}
	})
	if err != nil {
		o.stop()
		return nil, fmt.Errorf("bench: subscribe: %w", err)
	}
	o.subs = append(o.subs, progress)
	for _, s := range o.subs {
		_ = s.SetPendingLimits(-1, -1)
	}
	if err := nc.Flush(); err != nil {
		o.stop()
		return nil, fmt.Errorf("bench: flush: %w", err)
	}
	return o, nil
}

func (o *waitObserver) stop() {
	for _, s := range o.subs {
		_ = s.Unsubscribe()
	}
}

// WriteText prints a result for people.
func (r *WaitsResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "waits: n=%d agents=%d lead=%dms spread=%dms\n", r.N, r.Agents, r.LeadMs, r.SpreadMs)
	fmt.Fprintf(w, "wait requests/s: %.0f\n", r.RequestsPerS)
	fmt.Fprintf(w, "completion lateness ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", r.LatenessMs.P50, r.LatenessMs.P90, r.LatenessMs.P99, r.LatenessMs.Max)
	fmt.Fprintf(w, "missed: %d  duplicates: %d\n", r.Missed, r.Duplicates)
	fmt.Fprintf(w, "progress/s while all run: %.0f (one a second each: %.0f)\n", r.ProgressPerS, r.ProgressIdeal)
	for _, t := range []struct {
		name string
		r    *TimersResult
	}{{"timers alone", r.TimersAlone}, {"timers with waits", r.TimersWithWaits}} {
		if t.r != nil {
			fmt.Fprintf(w, "%s (n=%d): lateness ms p50 %.2f  p99 %.2f  max %.2f  missed %d  duplicates %d\n",
				t.name, t.r.N, t.r.LatenessMs.P50, t.r.LatenessMs.P99, t.r.LatenessMs.Max, t.r.Missed, t.r.Duplicates)
		}
	}
	fmt.Fprintf(w, "peak rss: %.1f MiB\n", float64(r.PeakRSSBytes)/(1<<20))
}
