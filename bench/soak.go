package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// SoakOptions configures a soak: one `chime serve` child on its embedded
// NATS server (a temp data dir; every CHIME_* setting of the bench's
// environment passed through, CHIME_RECORD_RETENTION among them), one-shot
// timers created at Rate for Duration across Agents agents, each due Lead
// after its create, every agent reading its inbox reliably (inbox.fetch
// with a wait, then inbox.ack), notifications sent at NotifyRate, and a row
// of the replica's memory and the fires every Every.
type SoakOptions struct {
	Duration   time.Duration
	Rate       float64 // timer creates per second, spread over the agents
	Agents     int
	Lead       time.Duration
	Every      time.Duration
	NotifyRate float64 // notifications per second, each to an agent at random; 0: none
	InFlight   int     // creates (and notifies) in flight at most
	// Grace is how long after its due time a fire not yet read counts as
	// missed in a row; the run's end waits this long for the last.
	Grace    time.Duration
	Exe      string   // the chime binary run as `serve`; default chime beside this binary, else on PATH
	Env      []string // added to the replica's environment
	Progress io.Writer
}

// Validate checks the options.
func (o *SoakOptions) Validate() error {
	switch {
	case o.Duration <= 0:
		return errors.New("bench: --duration must be positive")
	case !(o.Rate > 0):
		return errors.New("bench: --rate must be positive")
	case o.Agents <= 0:
		return errors.New("bench: --agents must be positive")
	case o.Lead <= 0:
		return errors.New("bench: --lead must be positive")
	case o.Every <= 0:
		return errors.New("bench: --every must be positive")
	case o.NotifyRate < 0:
		return errors.New("bench: --notify-rate must not be negative")
	case o.InFlight <= 0:
		return errors.New("bench: -c must be positive")
	case o.Grace <= 0:
		return errors.New("bench: --grace must be positive")
	}
	return nil
}

// SoakRow is one sample: the replica's memory and the fires so far.
type SoakRow struct {
	ElapsedS float64 `json:"elapsed_s"`
	// RSSBytes is the chime process's VmRSS (its embedded server
	// included); HeapBytes and Goroutines are from its metrics endpoint
	// (0 when it did not answer).
	RSSBytes   int64 `json:"rss_bytes"`
	HeapBytes  int64 `json:"heap_inuse_bytes"`
	Goroutines int64 `json:"goroutines"`
	// Created and Seen are timers created and fires read (distinct), so
	// far; Missed those not read Grace after their due time; Duplicated
	// fires read again as a new delivery or after their ack was confirmed.
	Created    int64 `json:"created"`
	Seen       int64 `json:"seen"`
	Missed     int64 `json:"missed"`
	Duplicated int64 `json:"duplicated"`
	Notified   int64 `json:"notified"`
	// LateMs is the fires read since the previous row: read (fetch
	// answered) minus due time.
	LateMs Latency `json:"lateness_ms"`
	Fires  int     `json:"fires_in_row"`
	// Load1 is the machine's one-minute load average (other work on it
	// shows here).
	Load1 float64 `json:"load1"`
}

// SoakResult is a soak's rows and totals.
type SoakResult struct {
	DurationS  float64   `json:"duration_s"`
	Rate       float64   `json:"rate"`
	Agents     int       `json:"agents"`
	LeadMs     int64     `json:"lead_ms"`
	NotifyRate float64   `json:"notify_rate"`
	Env        []string  `json:"env"` // the CHIME_* settings the replica ran with
	Rows       []SoakRow `json:"rows"`

	Created     int64    `json:"created"`
	CreateFails int64    `json:"create_failures"`
	Seen        int64    `json:"seen"`
	Missed      int64    `json:"missed"`
	Duplicated  int64    `json:"duplicated"`
	Redelivered int64    `json:"redelivered"` // returned again after an ack that failed: at least once, not an error
	Other       int64    `json:"other_deliveries"`
	Notified    int64    `json:"notified"`
	NotifyFails int64    `json:"notify_failures"`
	FetchErrors int64    `json:"fetch_errors"`
	AckErrors   int64    `json:"ack_errors"`
	LateMs      Latency  `json:"lateness_ms"`
	Failures    []string `json:"first_failures,omitempty"`
}

// Err fails a soak that missed or duplicated a fire, or could not create.
func (r *SoakResult) Err() error {
	if r.Missed > 0 || r.Duplicated > 0 || r.CreateFails > 0 || r.Seen != r.Created {
		return fmt.Errorf("bench: soak: %d created, %d read, %d missed, %d duplicated, %d creates failed", r.Created, r.Seen, r.Missed, r.Duplicated, r.CreateFails)
	}
	return nil
}

// soakAgent is one agent's fires: those created and not yet read
// (pending, by envelope ID, with their due time), and those read (seen,
// with the inbox sequence they were first read at).
type soakAgent struct {
	c     *client.Client
	mu    sync.Mutex
	pend  map[string]time.Time
	seen  map[string]uint64
	acked uint64 // the cursor as the last confirmed ack said; its reader's only
}

type soakRun struct {
	o      SoakOptions
	agents []*soakAgent

	created, createFails, seen, dups, redelivered, other atomic.Int64
	notified, notifyFails, fetchErrs, ackErrs            atomic.Int64

	mu       sync.Mutex
	late     []time.Duration // since the last row
	allLate  []time.Duration
	failures []string
}

// Soak runs the soak.
func Soak(ctx context.Context, o SoakOptions) (res *SoakResult, err error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	progress := progressf(o.Progress, "soak")
	exe, err := ownExe(o.Exe)
	if err != nil {
		return nil, err
	}
	p, url, stop, err := tasksTarget(ctx, TasksOptions{Embedded: true, Env: o.Env}, exe, progress)
	if err != nil {
		return nil, err
	}
	res = &SoakResult{Rate: o.Rate, Agents: o.Agents, LeadMs: o.Lead.Milliseconds(), NotifyRate: o.NotifyRate, Env: chimeEnv(p.env)}
	defer func() { stop(err != nil || res.Err() != nil) }()

	conns, closeConns, err := inboxConnect(url, soakConns)
	if err != nil {
		return nil, err
	}
	defer closeConns()
	r := &soakRun{o: o, agents: make([]*soakAgent, o.Agents)}
	prefix := fmt.Sprintf("sk%d", time.Now().UnixNano()%1e6)
	for i := range r.agents {
		c, err := client.New(conns[i%len(conns)], fmt.Sprintf("%s-%d", prefix, i))
		if err != nil {
			return nil, err
		}
		r.agents[i] = &soakAgent{c: c, pend: map[string]time.Time{}, seen: map[string]uint64{}}
	}

	readCtx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	var readers sync.WaitGroup
	for _, a := range r.agents {
		readers.Go(func() { r.read(readCtx, a) })
	}
	loadCtx, stopLoad := context.WithTimeout(ctx, o.Duration)
	defer stopLoad()
	var load sync.WaitGroup
	load.Go(func() { r.create(loadCtx) })
	if o.NotifyRate > 0 {
		load.Go(func() { r.notify(loadCtx) })
	}
	progress("%d agents, %.0f one-shot timers/s due %v after their create, %.0f notifications/s, for %v; a row every %v",
		o.Agents, o.Rate, o.Lead, o.NotifyRate, o.Duration, o.Every)

	start := time.Now()
	row := func() {
		w := r.row(ctx, p.pid(), p.httpAddr, time.Since(start))
		res.Rows = append(res.Rows, w)
		progress("%s", w.line())
	}
	progress("%s", soakHeader)
	each(loadCtx, o.Every, row)
	load.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	// The last timers are due Lead after their create; each is given Grace.
	end := time.Now().Add(o.Lead + o.Grace)
	for r.pending() > 0 && time.Now().Before(end) {
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	row()
	stopReaders()
	readers.Wait()

	res.DurationS = time.Since(start).Seconds()
	res.Created, res.CreateFails, res.Seen = r.created.Load(), r.createFails.Load(), r.seen.Load()
	res.Missed, res.Duplicated, res.Redelivered, res.Other = int64(r.pending()), r.dups.Load(), r.redelivered.Load(), r.other.Load()
	res.Notified, res.NotifyFails, res.FetchErrors, res.AckErrors = r.notified.Load(), r.notifyFails.Load(), r.fetchErrs.Load(), r.ackErrs.Load()
	r.mu.Lock()
	res.LateMs, res.Failures = summarize(r.allLate), r.failures
	r.mu.Unlock()
	return res, nil
}

// metricGoroutines is the Go collector's goroutine count on the metrics endpoint.
const metricGoroutines = "go_goroutines"

// The soak's fixed shape.
const (
	soakConns   = 4               // bench connections the agents are spread over
	soakRequest = 5 * time.Second // a create, notify or ack; a fetch gets its wait on top
	soakFetch   = 64              // a fetch's max
	soakRetry   = 100 * time.Millisecond
)

// create creates timers at Rate, round-robin over the agents, with at
// most InFlight at once, until ctx ends.
func (r *soakRun) create(ctx context.Context) {
	var next atomic.Int64
	r.paced(ctx, r.o.Rate, func(ctx context.Context) {
		a := r.agents[int(next.Add(1)-1)%len(r.agents)]
		t, err := a.c.CreateTimer(ctx, r.o.Lead.Milliseconds(), 0, "")
		if err == nil && t.NextFireAt == nil {
			err = fmt.Errorf("timer %s has no next_fire_at", t.ID)
		}
		if err != nil {
			r.createFails.Add(1)
			r.fail(fmt.Errorf("create: %w", err))
			return
		}
		r.created.Add(1)
		id := (&timers.TimerFired{TimerID: t.ID, Occurrence: 1}).EnvelopeID()
		a.mu.Lock()
		defer a.mu.Unlock()
		if _, ok := a.seen[id]; !ok { // read before its reply came: done already
			a.pend[id] = *t.NextFireAt
		}
	})
}

// notify sends notifications at NotifyRate, each to an agent at random.
func (r *soakRun) notify(ctx context.Context) {
	var n atomic.Int64
	r.paced(ctx, r.o.NotifyRate, func(ctx context.Context) {
		a := r.agents[rand.IntN(len(r.agents))]
		msg := fmt.Sprintf("soak %d", n.Add(1))
		if _, err := a.c.Notify(ctx, client.Notification{Message: msg, Title: "soak", Type: notifications.NotifyInfo}); err != nil {
			r.notifyFails.Add(1)
			r.fail(fmt.Errorf("notify: %w", err))
			return
		}
		r.notified.Add(1)
	})
}

// paced runs op rate times a second, each in a goroutine of its own
// with a soakRequest deadline (not cut short by ctx's end), at most
// InFlight at once, catching up after a slow tick, until ctx ends; it
// returns when the last has.
func (r *soakRun) paced(ctx context.Context, rate float64, op func(context.Context)) {
	var running sync.WaitGroup
	defer running.Wait()
	slots := make(chan struct{}, r.o.InFlight)
	begin := time.Now()
	done := 0
	each(ctx, 10*time.Millisecond, func() {
		for due := int(time.Since(begin).Seconds() * rate); done < due; done++ {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			running.Go(func() {
				defer func() { <-slots }()
				octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), soakRequest)
				defer cancel()
				op(octx)
			})
		}
	})
}

// read reads agent a's inbox reliably until ctx ends: a fetch that waits
// for a delivery, then an ack of what it returned.
func (r *soakRun) read(ctx context.Context, a *soakAgent) {
	wait := deliveries.MaxInboxWait
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, soakRequest+wait)
		began := time.Now()
		reply, err := a.c.FetchInbox(fctx, soakFetch, wait)
		cancel()
		now := time.Now()
		if err != nil {
			if ctx.Err() == nil {
				r.fetchErrs.Add(1)
				r.fail(fmt.Errorf("fetch: %w", err))
				backoff.Sleep(ctx, soakRetry)
			}
			continue
		}
		a.acked = max(a.acked, reply.Acked) // an ack whose reply was lost may have moved it
		if len(reply.Deliveries) == 0 {
			// Beyond chime's cap on waiting fetches a fetch answers at
			// once: do not spin.
			if now.Sub(began) < wait/2 {
				backoff.Sleep(ctx, soakRetry)
			}
			continue
		}
		last := uint64(0)
		for _, d := range reply.Deliveries {
			last = d.Seq
			r.delivered(a, d, now)
		}
		actx, cancel := context.WithTimeout(ctx, soakRequest)
		acked, err := a.c.AckInbox(actx, last)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.ackErrs.Add(1)
				r.fail(fmt.Errorf("ack: %w", err))
			}
			continue
		}
		a.acked = max(a.acked, acked)
	}
}

// delivered books one delivery read at now.
func (r *soakRun) delivered(a *soakAgent, d deliveries.InboxDelivery, now time.Time) {
	var env subjects.Envelope
	var fired timers.TimerFiredData
	if json.Unmarshal(d.Envelope, &env) != nil || env.Kind != subjects.KindTimerFired || json.Unmarshal(env.Data, &fired) != nil {
		r.other.Add(1)
		return
	}
	a.mu.Lock()
	first, ok := a.seen[env.ID]
	if !ok {
		a.seen[env.ID] = d.Seq
		delete(a.pend, env.ID)
	}
	a.mu.Unlock()
	switch {
	case !ok:
		r.seen.Add(1)
		r.mu.Lock()
		r.late = append(r.late, now.Sub(fired.DueAt))
		r.mu.Unlock()
	case d.Seq != first || a.acked >= d.Seq: // stored twice, or back after a confirmed ack
		r.dups.Add(1)
	default: // its ack failed: at least once
		r.redelivered.Add(1)
	}
}

// pending is how many fires created are not read yet.
func (r *soakRun) pending() int {
	n := 0
	for _, a := range r.agents {
		a.mu.Lock()
		n += len(a.pend)
		a.mu.Unlock()
	}
	return n
}

// overdue is how many fires are not read Grace after their due time.
func (r *soakRun) overdue(now time.Time) int64 {
	var n int64
	for _, a := range r.agents {
		a.mu.Lock()
		for _, due := range a.pend {
			if now.Sub(due) > r.o.Grace {
				n++
			}
		}
		a.mu.Unlock()
	}
	return n
}

// row samples the replica and the fires.
func (r *soakRun) row(ctx context.Context, pid int, httpAddr string, elapsed time.Duration) SoakRow {
	w := SoakRow{ElapsedS: elapsed.Seconds()}
	w.RSSBytes, _ = procMemory(pid)
	sctx, cancel := context.WithTimeout(ctx, soakRequest)
	if m, err := scrape(sctx, httpAddr); err == nil {
		w.HeapBytes, w.Goroutines = int64(m[metricHeap]), int64(m[metricGoroutines])
	}
	cancel()
	w.Created, w.Seen, w.Duplicated, w.Notified = r.created.Load(), r.seen.Load(), r.dups.Load(), r.notified.Load()
	w.Missed = r.overdue(time.Now())
	r.mu.Lock()
	late := r.late
	r.late = nil
	r.allLate = append(r.allLate, late...)
	r.mu.Unlock()
	w.LateMs, w.Fires = summarize(late), len(late)
	w.Load1 = loadAvg()
	return w
}

// fail keeps the first few failures' text.
func (r *soakRun) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.failures) < 5 {
		r.failures = append(r.failures, err.Error())
	}
}

const soakHeader = "  elapsed   rss MiB  heap MiB  goroutines   created      read  missed  dup  notified  fires  late p50 ms  late p99 ms  load1"

func (w SoakRow) line() string {
	return fmt.Sprintf("%8.0fs  %8.1f  %8.1f  %10d  %8d  %8d  %6d  %3d  %8d  %5d  %11.2f  %11.2f  %5.2f",
		w.ElapsedS, float64(w.RSSBytes)/(1<<20), float64(w.HeapBytes)/(1<<20), w.Goroutines, w.Created, w.Seen, w.Missed, w.Duplicated,
		w.Notified, w.Fires, w.LateMs.P50, w.LateMs.P99, w.Load1)
}

// loadAvg is the one-minute load average from /proc/loadavg, 0 when it
// cannot be read.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// chimeEnv is the CHIME_* settings of an environment, as run.
func chimeEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "CHIME_") && !strings.Contains(kv, "TOKEN") && !strings.Contains(kv, "SECRET") && !strings.Contains(kv, "PASSWORD") {
			out = append(out, kv)
		}
	}
	return out
}

// WriteText prints the rows and the totals.
func (r *SoakResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "soak: %.0f s, %.0f one-shot timers/s over %d agents (due %d ms after create), %.0f notifications/s; chime serve, embedded NATS\n",
		r.DurationS, r.Rate, r.Agents, r.LeadMs, r.NotifyRate)
	fmt.Fprintf(w, "settings: %s\n", strings.Join(r.Env, " "))
	fmt.Fprintln(w, soakHeader)
	for _, row := range r.Rows {
		fmt.Fprintln(w, row.line())
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "timers:\t%d created (%d failed), %d read, %d missed, %d duplicated (%d redelivered after a failed ack), %d other deliveries\n",
		r.Created, r.CreateFails, r.Seen, r.Missed, r.Duplicated, r.Redelivered, r.Other)
	fmt.Fprintf(tw, "lateness:\tp50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.1f ms (read minus due, the whole run)\n", r.LateMs.P50, r.LateMs.P90, r.LateMs.P99, r.LateMs.Max)
	fmt.Fprintf(tw, "notifications:\t%d sent (%d failed); fetch errors %d, ack errors %d\n", r.Notified, r.NotifyFails, r.FetchErrors, r.AckErrors)
	tw.Flush()
	for _, f := range r.Failures {
		fmt.Fprintf(w, "first failures: %s\n", f)
	}
}
