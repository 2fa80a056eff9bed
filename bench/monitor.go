package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// MonitorOptions configures the monitor benchmark: one `chime serve` child
// on a nats-server of its own, CHIME_MONITOR_SUBJECTS=monbench.{agent}.>.
//
// The latency phase sends Rate numbered lines a second, each carrying the
// time it was sent, for Duration to three monitors of three agents at
// once: a NATS subject monitor (a publish), a command monitor the bench
// feeds itself (a monitor.emit of one line), and a command monitor run by
// `chime monitor run` (a line the command prints); each line is timed to
// the arrival of the monitor_event carrying it at a core NATS subscriber
// of the agent's inbox subject. Rate is at most a monitor's refill (10
// lines/s), so the token bucket lets every line through.
//
// The flood phase then publishes FloodRate messages a second for Flood on
// one subject monitor's subject and counts what the agent gets.
type MonitorOptions struct {
	Rate      float64
	Duration  time.Duration
	FloodRate float64
	Flood     time.Duration // 0: no flood phase
	// Grace is waited after a phase's last line for its envelopes (and,
	// after a flood, for the monitor's record to settle).
	Grace    time.Duration
	Keep     bool     // keep the work dir (store, logs); kept anyway when the run fails
	Exe      string   // the chime binary, run as `serve` and as `monitor run`; default chime beside this binary, else on PATH
	Env      []string // added to the replica's environment
	Progress io.Writer
}

// Validate checks the options.
func (o *MonitorOptions) Validate() error {
	pace := monitors.DefaultPace()
	switch {
	case !(o.Rate > 0) || o.Rate > pace.Rate:
		return fmt.Errorf("bench: --rate must be positive and at most %g, a monitor's refill rate (above it the token bucket drops lines, and the latency measures the pacing)", pace.Rate)
	case o.Duration <= 0:
		return errors.New("bench: --duration must be positive")
	case o.Flood < 0:
		return errors.New("bench: --flood must not be negative")
	case o.Flood > 0 && !(o.FloodRate > 0):
		return errors.New("bench: --flood-rate must be positive")
	case o.Grace <= 0:
		return errors.New("bench: --grace must be positive")
	}
	return nil
}

// MonitorLatency is one source's latency: lines sent at Rate, each timed
// from its send to the arrival of the envelope carrying it.
type MonitorLatency struct {
	Source string `json:"source"` // subject, emit, command
	// From says what the timing starts at.
	From       string  `json:"from"`
	Sent       int     `json:"sent"`
	Received   int     `json:"received"`
	Missing    int     `json:"missing"`
	Duplicated int     `json:"duplicated"`
	Envelopes  int     `json:"envelopes"`
	MaxLines   int     `json:"max_lines_per_envelope"`
	Suppressed int64   `json:"suppressed"` // the monitor record's, at the end
	RatePerS   float64 `json:"rate_per_s"` // lines sent over the span from the first to the last
	LatencyMs  Latency `json:"latency_ms"`
	// ReplyMs is monitor.emit's round trip (emit only).
	ReplyMs *Latency `json:"emit_reply_ms,omitempty"`
	Failure string   `json:"failure,omitempty"`
}

// MonitorUsage is the processes' use of the machine over a phase.
type MonitorUsage struct {
	// ReplicaCPU and ServerCPU are CPU time over wall time, in percent of
	// one core.
	ReplicaCPU float64 `json:"replica_cpu_pct"`
	ServerCPU  float64 `json:"nats_server_cpu_pct"`
	// ReplicaRSS is the replica's VmRSS at the phase's end.
	ReplicaRSS int64 `json:"replica_rss_bytes"`
}

// MonitorFlood is what a flood of one subject monitor gave its agent.
type MonitorFlood struct {
	Rate      float64 `json:"rate"`
	Published int64   `json:"published"`
	PublishS  float64 `json:"publish_s"`
	// Envelopes are the monitor_event envelopes the agent received, Lines
	// the lines they held (an "N events suppressed" line not counted),
	// MaxPerS the most that arrived in one whole second from the first
	// publish, and SuppressedSaid the sum of their "N events suppressed"
	// lines (said in SuppressedLines envelopes).
	Envelopes       int     `json:"envelopes"`
	EnvelopesPerS   float64 `json:"envelopes_per_s"`
	MaxPerS         int     `json:"max_envelopes_in_a_second"`
	Lines           int64   `json:"lines_delivered"`
	SuppressedSaid  int64   `json:"suppressed_said"`
	SuppressedLines int     `json:"envelopes_saying_suppressed"`
	// The record's counts over the flood (the warm-up line taken off):
	// events and batches delivered, lines suppressed (those said, plus
	// PendingSuppressed, not said yet), and the lines published that the
	// watch never saw (after the monitor stopped).
	Events            int64 `json:"record_events"`
	Batches           int64 `json:"record_batches"`
	Suppressed        int64 `json:"record_suppressed"`
	PendingSuppressed int64 `json:"record_pending_suppressed"`
	Unseen            int64 `json:"unseen"`
	// Status and StopReason are the record's at the end of the flood;
	// StoppedAfterS is when its monitor_stopped arrived, from the first
	// publish (0: it did not stop), FloodSinceS when the record began
	// counting the flood.
	Status        string       `json:"status"`
	StopReason    string       `json:"stop_reason,omitempty"`
	StoppedAfterS float64      `json:"stopped_after_s,omitempty"`
	FloodSinceS   float64      `json:"flood_since_s,omitempty"`
	Usage         MonitorUsage `json:"usage"`
	Failure       string       `json:"failure,omitempty"`
}

// MonitorResult is what the monitor benchmark measured.
type MonitorResult struct {
	Rate      float64          `json:"rate"`
	DurationS float64          `json:"duration_s"`
	Latency   []MonitorLatency `json:"latency"`
	Usage     MonitorUsage     `json:"latency_usage"`
	Flood     *MonitorFlood    `json:"flood,omitempty"`
	// PeakRSS is the replica's VmHWM at the end.
	PeakRSS int64 `json:"replica_peak_rss_bytes"`
}

// Err fails a run that lost or repeated a line of the latency phase, or
// whose flood could not run.
func (r *MonitorResult) Err() error {
	var errs []error
	for _, l := range r.Latency {
		if l.Failure != "" {
			errs = append(errs, fmt.Errorf("%s: %s", l.Source, l.Failure))
		}
		if l.Missing > 0 || l.Duplicated > 0 || l.Received != l.Sent {
			errs = append(errs, fmt.Errorf("%s: %d lines sent, %d received, %d missing, %d duplicated", l.Source, l.Sent, l.Received, l.Missing, l.Duplicated))
		}
	}
	if r.Flood != nil && r.Flood.Failure != "" {
		errs = append(errs, fmt.Errorf("flood: %s", r.Flood.Failure))
	}
	if len(errs) > 0 {
		return fmt.Errorf("bench: monitor: %w", errors.Join(errs...))
	}
	return nil
}

// monitorSubjects is the replica's CHIME_MONITOR_SUBJECTS.
const monitorSubjects = "monbench." + monitors.AgentPlaceholder + ".>"

// monitorRequest bounds one request of the bench's.
const monitorRequest = 5 * time.Second

// monitorWarm bounds the wait for a subject monitor's watch to start.
const monitorWarm = 20 * time.Second

// Monitor runs the monitor benchmark.
func Monitor(ctx context.Context, o MonitorOptions) (res *MonitorResult, err error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	progress := progressf(o.Progress, "monitor")
	exe, err := ownExe(o.Exe)
	if err != nil {
		return nil, err
	}
	f, err := startFleet(ctx, fleetOptions{servers: 1, replicas: 1, exe: exe, progress: progress,
		env: append([]string{"CHIME_MONITOR_SUBJECTS=" + monitorSubjects}, o.Env...)})
	if err != nil {
		return nil, err
	}
	defer func() { f.close(o.Keep || err != nil || (res != nil && res.Err() != nil)) }()
	conns, closeConns, err := inboxConnect(f.urls(), 3)
	if err != nil {
		return nil, err
	}
	defer closeConns()
	r := &monitorRun{o: o, exe: exe, url: f.urls(), pub: conns[0], sub: conns[1], req: conns[2], progress: progress,
		prefix: fmt.Sprintf("mb%d", time.Now().UnixNano()%1e6)}
	pid := f.replicas[0].pid()
	res = &MonitorResult{Rate: o.Rate, DurationS: o.Duration.Seconds()}

	progress("latency: %g lines/s for %v to a subject monitor, an emitting bench and `chime monitor run`, at once", o.Rate, o.Duration)
	usage := r.usage(f)
	res.Latency = make([]MonitorLatency, 3)
	var g errgroup.Group
	g.Go(func() (err error) { res.Latency[0], err = r.subjectLatency(ctx); return err })
	g.Go(func() (err error) { res.Latency[1], err = r.emitLatency(ctx); return err })
	g.Go(func() (err error) { res.Latency[2], err = r.commandLatency(ctx); return err })
	if err := g.Wait(); err != nil {
		return nil, err
	}
	res.Usage = usage()

	if o.Flood > 0 {
		progress("flood: %g messages/s for %v on one subject monitor", o.FloodRate, o.Flood)
		if res.Flood, err = r.flood(ctx, f); err != nil {
			return nil, err
		}
	}
	_, res.PeakRSS = procMemory(pid)
	return res, nil
}

// monitorRun is one run's connections and agents.
type monitorRun struct {
	o             MonitorOptions
	exe, url      string
	pub, sub, req *nats.Conn
	prefix        string
	progress      func(string, ...any)
}

// usage starts measuring the processes' use of the machine; the returned
// func ends it.
func (r *monitorRun) usage(f *fleet) func() MonitorUsage {
	pid, spid := f.replicas[0].pid(), f.servers[0].Pid()
	began, rcpu, scpu := time.Now(), procCPU(pid), procCPU(spid)
	return func() MonitorUsage {
		wall := time.Since(began).Seconds()
		u := MonitorUsage{
			ReplicaCPU: 100 * (procCPU(pid) - rcpu).Seconds() / wall,
			ServerCPU:  100 * (procCPU(spid) - scpu).Seconds() / wall,
		}
		u.ReplicaRSS, _ = procMemory(pid)
		return u
	}
}

// tracker books the monitor deliveries of one agent, read from its inbox
// subject as they are stored.
type tracker struct {
	mu sync.Mutex
	// lat is each numbered line's latency, by its number; dups counts a
	// number seen again; other counts lines without one (warm-ups).
	lat       map[int]time.Duration
	dups      int
	other     int
	envelopes int
	maxLines  int
	lines     int64
	said      int64 // "N events suppressed", summed
	saying    int   // envelopes that said it
	arrivals  []time.Time
	// firstSent and lastSent are the earliest and latest send times the
	// numbered lines carried.
	firstSent, lastSent time.Time
	stopped             *monitors.StoppedData
	stoppedAt           time.Time
	bad                 int // deliveries that could not be decoded
}

func newTracker() *tracker { return &tracker{lat: map[int]time.Duration{}} }

// track subscribes t to agent's inbox subject on nc.
func track(nc *nats.Conn, agent string) (*tracker, func(), error) {
	t := newTracker()
	s, err := nc.Subscribe(subjects.Inbox(agent), func(m *nats.Msg) { t.add(m.Data, time.Now()) })
	if err != nil {
		return nil, nil, fmt.Errorf("bench: subscribe: %w", err)
	}
	_ = s.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		_ = s.Unsubscribe()
		return nil, nil, fmt.Errorf("bench: flush: %w", err)
	}
	return t, func() { _ = s.Unsubscribe() }, nil
}

// add books one stored envelope that arrived at now.
func (t *tracker) add(data []byte, now time.Time) {
	var env subjects.Envelope
	if json.Unmarshal(data, &env) != nil {
		t.mu.Lock()
		t.bad++
		t.mu.Unlock()
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch env.Kind {
	case subjects.KindMonitorStopped:
		var d monitors.StoppedData
		if json.Unmarshal(env.Data, &d) != nil {
			t.bad++
			return
		}
		if t.stopped == nil {
			t.stopped, t.stoppedAt = &d, now
		}
	case subjects.KindMonitorEvent:
		var d monitors.EventData
		if json.Unmarshal(env.Data, &d) != nil {
			t.bad++
			return
		}
		t.envelopes++
		t.arrivals = append(t.arrivals, now)
		t.maxLines = max(t.maxLines, len(d.Lines))
		t.lines += int64(len(d.Lines))
		if d.Suppressed > 0 {
			t.said += d.Suppressed
			t.saying++
		}
		for _, l := range d.Lines {
			n, sent, ok := parseTimed(l)
			switch {
			case !ok:
				t.other++
			case t.lat[n] != 0:
				t.dups++
			default:
				t.lat[n] = max(now.Sub(sent), time.Nanosecond) // 0 marks not seen
				if t.firstSent.IsZero() || sent.Before(t.firstSent) {
					t.firstSent = sent
				}
				t.lastSent = maxTime(t.lastSent, sent)
			}
		}
	}
}

// reset forgets what was booked (a warm-up's deliveries).
func (t *tracker) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lat, t.dups, t.other, t.envelopes, t.maxLines, t.lines, t.said, t.saying = map[int]time.Duration{}, 0, 0, 0, 0, 0, 0, 0
	t.arrivals, t.firstSent, t.lastSent, t.stopped, t.stoppedAt, t.bad = nil, time.Time{}, time.Time{}, nil, time.Time{}, 0
}

// seen is how many numbered lines and other lines arrived.
func (t *tracker) seen() (numbered, other int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.lat), t.other
}

// timedLine is line n of a phase, sent at at: "<n> <unix nanoseconds>",
// what the command's shell loop prints too.
func timedLine(n int, at time.Time) string { return fmt.Sprintf("%d %d", n, at.UnixNano()) }

// parseTimed reads a line's last two fields as timedLine wrote them (a
// subject monitor's line starts with the subject).
func parseTimed(line string) (int, time.Time, bool) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0, time.Time{}, false
	}
	n, err1 := strconv.Atoi(f[len(f)-2])
	ns, err2 := strconv.ParseInt(f[len(f)-1], 10, 64)
	if err1 != nil || err2 != nil || n <= 0 {
		return 0, time.Time{}, false
	}
	return n, time.Unix(0, ns), true
}

// latency is what t booked of sent lines numbered 1..sent.
func (t *tracker) latency(source, from string, sent int) MonitorLatency {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := MonitorLatency{Source: source, From: from, Sent: sent, Received: len(t.lat), Duplicated: t.dups, Envelopes: t.envelopes, MaxLines: t.maxLines}
	d := make([]time.Duration, 0, len(t.lat))
	for n := 1; n <= sent; n++ {
		if v, ok := t.lat[n]; ok {
			d = append(d, v)
		} else {
			l.Missing++
		}
	}
	l.LatencyMs = summarize(d)
	return l
}

// waitSeen waits until t has seen want numbered lines, or grace passes.
func (r *monitorRun) waitSeen(ctx context.Context, t *tracker, want int) {
	end := time.Now().Add(r.o.Grace)
	for time.Now().Before(end) {
		if n, _ := t.seen(); n >= want {
			return
		}
		if !backoff.Sleep(ctx, 20*time.Millisecond) {
			return
		}
	}
}

// lines is how many lines a phase sends.
func (r *monitorRun) lines() int { return max(int(r.o.Rate*r.o.Duration.Seconds()), 1) }

// paced calls send(n) for n from 1 to count, n at begin plus (n-1)/rate.
func paced(ctx context.Context, rate float64, count int, send func(n int) error) (first, last time.Time, err error) {
	begin := time.Now()
	for n := 1; n <= count; n++ {
		at := begin.Add(time.Duration(float64(n-1) / rate * float64(time.Second)))
		if !backoff.Sleep(ctx, time.Until(at)) {
			return first, last, ctx.Err()
		}
		now := time.Now()
		if n == 1 {
			first = now
		}
		last = now
		if err := send(n); err != nil {
			return first, last, err
		}
	}
	return first, last, nil
}

func spanRate(count int, first, last time.Time) float64 {
	if s := last.Sub(first).Seconds(); s > 0 && count > 1 {
		return float64(count-1) / s
	}
	return 0
}

// start starts a persistent monitor of agent.
func (r *monitorRun) start(ctx context.Context, agent string, req monitors.StartRequest) (*client.Client, *monitors.Monitor, error) {
	c, err := client.New(r.req, agent)
	if err != nil {
		return nil, nil, err
	}
	req.Persistent = true
	body, err := json.Marshal(req)
	if err != nil {
		return nil, nil, err
	}
	var m monitors.Monitor
	rctx, cancel := context.WithTimeout(ctx, monitorRequest)
	defer cancel()
	if err := c.Request(rctx, monitors.ActionStart, body, &m); err != nil {
		return nil, nil, fmt.Errorf("bench: monitor.start for %s: %w", agent, err)
	}
	return c, &m, nil
}

// record reads a monitor's record.
func record(ctx context.Context, c *client.Client, id, action string) (*monitors.Monitor, error) {
	body, _ := json.Marshal(monitors.Ref{MonitorID: id})
	var m monitors.Monitor
	rctx, cancel := context.WithTimeout(ctx, monitorRequest)
	defer cancel()
	if err := c.Request(rctx, action, body, &m); err != nil {
		return nil, fmt.Errorf("bench: %s %s: %w", action, id, err)
	}
	return &m, nil
}

// warm publishes a line on subject every 200 ms until t sees one: the
// replica holding the monitor's shard watches it from then on.
func (r *monitorRun) warm(ctx context.Context, t *tracker, subject string) error {
	end := time.Now().Add(monitorWarm)
	for time.Now().Before(end) {
		if err := r.pub.Publish(subject, []byte("warm-up")); err != nil {
			return fmt.Errorf("bench: publish: %w", err)
		}
		for range 10 {
			if _, other := t.seen(); other > 0 {
				return nil
			}
			if !backoff.Sleep(ctx, 20*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	return fmt.Errorf("bench: the subject monitor on %s delivered nothing within %v", subject, monitorWarm)
}

// settleWarm lets a warm-up line published again before the first was
// seen reach the inbox too, then forgets the warm-up.
func settleWarm(ctx context.Context, t *tracker) error {
	if !backoff.Sleep(ctx, 2*monitors.BatchWindow+300*time.Millisecond) {
		return ctx.Err()
	}
	t.reset()
	return nil
}

// subjectLatency times publishes on a subject monitor's subject.
func (r *monitorRun) subjectLatency(ctx context.Context) (MonitorLatency, error) {
	agent := r.prefix + "-subject"
	subject := "monbench." + agent + ".latency"
	t, stop, err := track(r.sub, agent)
	if err != nil {
		return MonitorLatency{}, err
	}
	defer stop()
	c, m, err := r.start(ctx, agent, monitors.StartRequest{Description: "bench: subject latency", Subject: subject})
	if err != nil {
		return MonitorLatency{}, err
	}
	if err := r.warm(ctx, t, subject); err != nil {
		return MonitorLatency{}, err
	}
	if err := settleWarm(ctx, t); err != nil {
		return MonitorLatency{}, err
	}
	count := r.lines()
	first, last, err := paced(ctx, r.o.Rate, count, func(n int) error {
		return r.pub.Publish(subject, []byte(timedLine(n, time.Now())))
	})
	if err != nil {
		return MonitorLatency{}, err
	}
	r.waitSeen(ctx, t, count)
	l := t.latency("subject", "publish on the subject", count)
	l.RatePerS = spanRate(count, first, last)
	if rec, err := record(ctx, c, m.ID, monitors.ActionGet); err == nil {
		l.Suppressed = rec.Suppressed
	} else {
		l.Failure = err.Error()
	}
	return l, nil
}

// emitLatency times monitor.emit requests of one line each, the bench
// being a command monitor's executor: no batching window.
func (r *monitorRun) emitLatency(ctx context.Context) (MonitorLatency, error) {
	agent := r.prefix + "-emit"
	t, stop, err := track(r.sub, agent)
	if err != nil {
		return MonitorLatency{}, err
	}
	defer stop()
	c, m, err := r.start(ctx, agent, monitors.StartRequest{Description: "bench: emit latency", Command: "chime-bench monitor (sends monitor.emit itself)"})
	if err != nil {
		return MonitorLatency{}, err
	}
	count := r.lines()
	replies := make([]time.Duration, 0, count)
	var seq int64
	var failures []string
	first, last, err := paced(ctx, r.o.Rate, count, func(n int) error {
		sent := time.Now()
		body, err := json.Marshal(monitors.EmitRequest{MonitorID: m.ID, Seq: &seq, Lines: []string{timedLine(n, sent)}})
		if err != nil {
			return err
		}
		// A reply lost is sent again under the same seq, as an executor
		// does: stored once.
		for try := 0; ; try++ {
			var reply monitors.EmitReply
			rctx, cancel := context.WithTimeout(ctx, monitorRequest)
			err = c.Request(rctx, monitors.ActionEmit, body, &reply)
			cancel()
			if err == nil {
				replies = append(replies, time.Since(sent))
				seq = reply.NextSeq
				return nil
			}
			if len(failures) < 3 {
				failures = append(failures, err.Error())
			}
			if try == 2 || ctx.Err() != nil {
				return err
			}
		}
	})
	if err != nil {
		return MonitorLatency{}, fmt.Errorf("bench: monitor.emit: %w", err)
	}
	r.waitSeen(ctx, t, count)
	l := t.latency("emit", "monitor.emit sent (1 line a batch)", count)
	l.RatePerS = spanRate(count, first, last)
	reply := summarize(replies)
	l.ReplyMs = &reply
	if rec, err := record(ctx, c, m.ID, monitors.ActionGet); err == nil {
		l.Suppressed = rec.Suppressed
	} else {
		failures = append(failures, err.Error())
	}
	l.Failure = strings.Join(failures, "; ")
	return l, nil
}

// commandLatency times the lines a command prints, run by `chime monitor
// run` as a monitor's source: the executor's 200 ms window included.
func (r *monitorRun) commandLatency(ctx context.Context) (MonitorLatency, error) {
	agent := r.prefix + "-command"
	t, stop, err := track(r.sub, agent)
	if err != nil {
		return MonitorLatency{}, err
	}
	defer stop()
	count := r.lines()
	// GNU date: nanoseconds. The loop's own forks make it a little slower
	// than Rate.
	script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do i=$((i+1)); echo "$i $(date +%%s%%N)"; sleep %.3f; done`, count, 1/r.o.Rate)
	cctx, cancel := context.WithTimeout(ctx, 2*r.o.Duration+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, r.exe, "monitor", "run", "--agent", agent, "--id", "command", "--description", "bench: command latency",
		"--persistent", "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "CHIME_NATS_URL="+r.url, "CHIME_NATS_TOKEN=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return MonitorLatency{}, fmt.Errorf("bench: chime monitor run: %w: %s", err, stderr.String())
	}
	r.waitSeen(ctx, t, count)
	l := t.latency("command", "line printed (chime monitor run)", count)
	out := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var final monitors.Monitor
	if len(out) != 2 || json.Unmarshal([]byte(out[1]), &final) != nil {
		l.Failure = fmt.Sprintf("chime monitor run printed %q", stdout.String())
		return l, nil
	}
	l.Suppressed = final.Suppressed
	if final.StopReason != monitors.ReasonSourceEnded || final.ExitCode == nil || *final.ExitCode != 0 {
		l.Failure = fmt.Sprintf("the monitor ended %s (exit code %v): %s", final.StopReason, final.ExitCode, stderr.String())
	}
	// The span of the lines as the command stamped them.
	t.mu.Lock()
	l.RatePerS = spanRate(count, t.firstSent, t.lastSent)
	t.mu.Unlock()
	return l, nil
}

// flood publishes FloodRate messages a second on one subject monitor's
// subject for Flood.
func (r *monitorRun) flood(ctx context.Context, f *fleet) (*MonitorFlood, error) {
	o := r.o
	agent := r.prefix + "-flood"
	subject := "monbench." + agent + ".flood"
	t, stop, err := track(r.sub, agent)
	if err != nil {
		return nil, err
	}
	defer stop()
	c, m, err := r.start(ctx, agent, monitors.StartRequest{Description: "bench: flood", Subject: subject})
	if err != nil {
		return nil, err
	}
	if err := r.warm(ctx, t, subject); err != nil {
		return nil, err
	}
	if err := settleWarm(ctx, t); err != nil {
		return nil, err
	}
	before, err := record(ctx, c, m.ID, monitors.ActionGet)
	if err != nil {
		return nil, err
	}
	res := &MonitorFlood{Rate: o.FloodRate}
	usage := r.usage(f)
	begin := time.Now()
	fctx, cancel := context.WithTimeout(ctx, o.Flood)
	var published int64
	var pubErr error
	each(fctx, 10*time.Millisecond, func() {
		for due := int64(time.Since(begin).Seconds() * o.FloodRate); published < due && pubErr == nil; {
			published++
			pubErr = r.pub.Publish(subject, []byte(timedLine(int(published), time.Now())))
		}
	})
	cancel()
	res.PublishS = time.Since(begin).Seconds()
	res.Published = published
	if pubErr != nil {
		return nil, fmt.Errorf("bench: publish: %w", pubErr)
	}
	if err := r.pub.Flush(); err != nil {
		return nil, fmt.Errorf("bench: flush: %w", err)
	}
	// The last batches, and the record's counts, settle.
	if !backoff.Sleep(ctx, o.Grace) {
		return nil, ctx.Err()
	}
	res.Usage = usage()
	after, err := record(ctx, c, m.ID, monitors.ActionGet)
	if err != nil {
		return nil, err
	}
	res.Status, res.StopReason = string(after.Status), after.StopReason
	res.Events, res.Batches = after.Events-before.Events, after.Batches-before.Batches
	res.Suppressed, res.PendingSuppressed = after.Suppressed-before.Suppressed, after.PendingSuppressed
	res.Unseen = res.Published - res.Events - res.Suppressed
	if after.FloodSince != nil {
		res.FloodSinceS = after.FloodSince.Sub(begin).Seconds()
	}

	t.mu.Lock()
	res.Envelopes, res.Lines, res.SuppressedSaid, res.SuppressedLines = t.envelopes, t.lines, t.said, t.saying
	perS := map[int]int{}
	for _, at := range t.arrivals {
		perS[int(at.Sub(begin)/time.Second)]++
	}
	for _, n := range perS {
		res.MaxPerS = max(res.MaxPerS, n)
	}
	if t.stopped != nil {
		res.StoppedAfterS = t.stoppedAt.Sub(begin).Seconds()
	}
	if t.bad > 0 || t.dups > 0 {
		res.Failure = fmt.Sprintf("%d deliveries not decoded, %d lines delivered twice", t.bad, t.dups)
	}
	t.mu.Unlock()
	if res.PublishS > 0 {
		res.EnvelopesPerS = float64(res.Envelopes) / res.PublishS
	}
	if after.Status == monitors.Running {
		body, _ := json.Marshal(monitors.StopRequest{MonitorID: m.ID})
		rctx, cancel := context.WithTimeout(ctx, monitorRequest)
		err := c.Request(rctx, monitors.ActionStop, body, &monitors.Monitor{})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("bench: monitor.stop: %w", err)
		}
	}
	return res, nil
}

// WriteText prints a result for people.
func (r *MonitorResult) WriteText(w io.Writer) {
	pace := monitors.DefaultPace()
	fmt.Fprintf(w, "monitors: one chime replica on a nats-server of its own; pace: a burst of %d lines, then %g/s; a batch closes %v after its first line or at %d lines\n",
		pace.Burst, pace.Rate, monitors.BatchWindow, monitors.MaxBatchLines)
	fmt.Fprintf(w, "latency: %g lines/s for %.0f s to three monitors at once, each line timed from its send to the arrival of its monitor_event at a subscriber of the inbox subject\n",
		r.Rate, r.DurationS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "source\tfrom\tsent\treceived\tmissing\tdup\tenvelopes\tmax lines/env\tsuppressed\tlines/s\tp50 ms\tp90 ms\tp99 ms\tmax ms\t")
	for _, l := range r.Latency {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.2f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", l.Source, l.From, l.Sent, l.Received, l.Missing, l.Duplicated,
			l.Envelopes, l.MaxLines, l.Suppressed, l.RatePerS, l.LatencyMs.P50, l.LatencyMs.P90, l.LatencyMs.P99, l.LatencyMs.Max)
	}
	tw.Flush()
	for _, l := range r.Latency {
		if l.ReplyMs != nil {
			fmt.Fprintf(w, "monitor.emit round trip: p50 %.2f ms  p99 %.2f ms  max %.2f ms\n", l.ReplyMs.P50, l.ReplyMs.P99, l.ReplyMs.Max)
		}
		if l.Failure != "" {
			fmt.Fprintf(w, "%s FAILED: %s\n", l.Source, l.Failure)
		}
	}
	fmt.Fprintf(w, "(the subject's and the command's lines wait in a batch for up to %v after its first line; emit sends each line as its own batch)\n", monitors.BatchWindow)
	fmt.Fprintf(w, "usage: %s\n", r.Usage.line())
	if f := r.Flood; f != nil {
		fmt.Fprintf(w, "flood: %d messages published in %.1f s (%.0f/s) on one subject monitor's subject\n", f.Published, f.PublishS, float64(f.Published)/f.PublishS)
		fmt.Fprintf(w, "  the agent got %d monitor_event envelopes (%.1f/s, at most %d in one second) holding %d lines; %d of them said \"N events suppressed\" (%d lines in all)\n",
			f.Envelopes, f.EnvelopesPerS, f.MaxPerS, f.Lines, f.SuppressedLines, f.SuppressedSaid)
		fmt.Fprintf(w, "  record: %d events in %d batches, %d suppressed (%d not said yet); %d published lines the watch did not see\n",
			f.Events, f.Batches, f.Suppressed, f.PendingSuppressed, f.Unseen)
		switch {
		case f.StopReason != "":
			fmt.Fprintf(w, "  stopped: %s, its monitor_stopped %.1f s after the first publish (flooding counted from %.1f s)\n", f.StopReason, f.StoppedAfterS, f.FloodSinceS)
		default:
			fmt.Fprintf(w, "  still %s at the end (flooding since %.1f s; the flood stop comes after %v of it: --flood above that shows it)\n", f.Status, f.FloodSinceS, monitors.FloodFor)
		}
		fmt.Fprintf(w, "  usage: %s\n", f.Usage.line())
		if f.Failure != "" {
			fmt.Fprintf(w, "  FAILED: %s\n", f.Failure)
		}
	}
	fmt.Fprintf(w, "replica peak rss (VmHWM): %.1f MiB\n", float64(r.PeakRSS)/(1<<20))
}

func (u MonitorUsage) line() string {
	return fmt.Sprintf("replica cpu %.1f%% of a core, nats-server %.1f%%; replica rss %.1f MiB", u.ReplicaCPU, u.ServerCPU, float64(u.ReplicaRSS)/(1<<20))
}
