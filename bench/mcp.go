package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"
)

// MCPOptions configures the MCP benchmark: a replica's agents' MCP server
// (POST /api/agents/{id}/mcp) driven by the go-sdk client with the Tasks
// extension, next to the same waits over plain NATS, in one run.
type MCPOptions struct {
	N       int // tools/call wait, each answered with a task handle (and as many wait.request over NATS)
	Clients int // agents calling at once, each with its own MCP session, HTTP client and NATS connection
	Seconds int // each of those waits' length: long, so that their tasks are live for tasks/get
	Gets    int // tasks/get on the live tasks

	Visible        int           // short waits per way of seeing their end
	VisibleClients int           // agents per way, waiting one wait after another
	WaitSeconds    int           // the short waits' length
	Poll           time.Duration // the fast poller's tasks/get interval

	// Tokens turns authorization on: every agent presents a token issued
	// for it, on HTTP and on NATS. Off, the routes are open on loopback and
	// NATS has no authorization.
	Tokens bool
	Log    *slog.Logger
	// Progress, when set, receives a line per phase.
	Progress io.Writer
}

// Validate checks the options.
func (o *MCPOptions) Validate() error {
	switch {
	case o.N <= 0:
		return errors.New("bench: -n must be positive")
	case o.Clients <= 0:
		return errors.New("bench: -c must be positive")
	case o.Seconds < 60:
		return errors.New("bench: --seconds must be at least 60: the tasks must stay live through tasks/get")
	case o.Gets < 0:
		return errors.New("bench: --gets must not be negative")
	case o.Visible < 0:
		return errors.New("bench: --visible must not be negative")
	case o.Visible > 0 && o.VisibleClients <= 0:
		return errors.New("bench: --visible-c must be positive")
	case o.Visible > 0 && o.WaitSeconds <= 0:
		return errors.New("bench: --wait must be positive")
	case o.Visible > 0 && o.Poll <= 0:
		return errors.New("bench: --poll must be positive")
	}
	return nil
}

// MCPResult is what the MCP benchmark measured.
type MCPResult struct {
	N       int  `json:"n"`
	Clients int  `json:"clients"`
	Seconds int  `json:"seconds"`
	Tokens  bool `json:"tokens"`
	// HTTPClient says how the MCP clients reach the server.
	HTTPClient string `json:"http_client"`

	// Handle: tools/call wait, from the call to the task handle in the
	// client's hands (go-sdk client, its encoding and decoding included);
	// HandleWireMs is the same calls' HTTP round trips alone.
	Handle       MCPPhase `json:"tools_call_to_handle"`
	HandleWireMs Latency  `json:"tools_call_wire_ms"`
	// NATSRequest: the same waits as wait.request over NATS, request to
	// reply, from as many agents at once.
	NATSRequest MCPPhase `json:"nats_wait_request"`
	// Get: tasks/get on live (working) tasks; Cancel: tasks/cancel of each
	// of them; NATSCancel: wait.cancel of the NATS waits.
	Get        MCPPhase `json:"tasks_get_live"`
	Cancel     MCPPhase `json:"tasks_cancel"`
	NATSCancel MCPPhase `json:"nats_wait_cancel"`

	// The short waits, every way of seeing their end at once: the time
	// from the wait's target to the end in the client's hands.
	WaitSeconds  int          `json:"wait_seconds"`
	PollMs       int64        `json:"poll_ms"`
	ServerPollMs []int64      `json:"server_poll_interval_ms"` // the intervals the server suggested
	Visible      []MCPVisible `json:"wait_to_completed_visible"`

	PeakRSSBytes int64 `json:"peak_rss_bytes"`
}

// MCPPhase is one kind of call, made many times.
type MCPPhase struct {
	N         int     `json:"n"`
	PerS      float64 `json:"per_s"`
	LatencyMs Latency `json:"latency_ms"`
	// CPUMsPerCall is the process's CPU time over the phase per call:
	// client, replica and embedded server together (they share the
	// process), so a figure to compare calls by, not chime's alone.
	CPUMsPerCall float64 `json:"cpu_ms_per_call"`
	Errors       int     `json:"errors"`
	FirstErr     string  `json:"first_error,omitempty"`
}

// MCPVisible is one way of seeing a short wait's end.
type MCPVisible struct {
	Way string `json:"way"`
	How string `json:"how"`
	N   int    `json:"n"`
	// LatenessMs: the end seen by the client minus the wait's target.
	LatenessMs Latency `json:"lateness_ms"`
	// FireMs, for tasks: the record's end (the completed task's
	// lastUpdatedAt) minus the target, the part of the lateness that is
	// the fire's.
	FireMs *Latency `json:"fire_ms,omitempty"`
	// CallsPerWait: tasks/get (or inbox.fetch) calls per wait, the
	// handle's call not counted.
	CallsPerWait float64 `json:"calls_per_wait,omitempty"`
	Missed       int     `json:"missed"`
	FirstErr     string  `json:"first_error,omitempty"`
}

// Err reports a run in which calls failed or waits were not seen to end.
func (r *MCPResult) Err() error {
	var errs []error
	for _, p := range []struct {
		name string
		p    MCPPhase
	}{{"tools/call", r.Handle}, {"wait.request", r.NATSRequest}, {"tasks/get", r.Get}, {"tasks/cancel", r.Cancel}, {"wait.cancel", r.NATSCancel}} {
		if p.p.Errors > 0 {
			errs = append(errs, fmt.Errorf("bench: %d of %d %s failed, the first: %s", p.p.Errors, p.p.N, p.name, p.p.FirstErr))
		}
	}
	for _, v := range r.Visible {
		if v.Missed > 0 {
			errs = append(errs, fmt.Errorf("bench: %s: %d of %d waits not seen to end, the first: %s", v.Way, v.Missed, v.N, v.FirstErr))
		}
	}
	return errors.Join(errs...)
}

// MCP runs the benchmark on an in-process replica on an embedded server:
// N task handles over MCP, then tasks/get on them and their cancel; the
// same N waits over NATS; then short waits seen to end every way at once.
func MCP(ctx context.Context, o MCPOptions) (*MCPResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	progress := func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "mcp: "+format+"\n", args...)
		}
	}
	r, operator, stop, err := local(ctx, o.Tokens, o.Log)
	if err != nil {
		return nil, err
	}
	defer stop()
	var auth []nats.Option
	if operator != "" {
		auth = append(auth, nats.Token(operator))
	}
	f := &mcpFleet{url: r.NATSURL(), http: "http://" + r.HTTPAddr(), auth: auth, tokens: o.Tokens,
		run: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9)}
	defer f.close()

	res := &MCPResult{N: o.N, Clients: o.Clients, Seconds: o.Seconds, Tokens: o.Tokens,
		HTTPClient: "one go-sdk client session and one http.Client (a keep-alive http.Transport of its own) per agent; " +
			"JSON responses, no standalone SSE stream (the stateless server has none)"}

	progress("%d agents over MCP, %d over NATS", o.Clients, o.Clients)
	mcpAgents, err := f.mcpAgents(ctx, "t", o.Clients, true)
	if err != nil {
		return nil, err
	}
	natsAgents, err := f.natsAgents(ctx, "n", o.Clients)
	if err != nil {
		return nil, err
	}
	// A warm-up call each, unmeasured (connections, first lookups).
	for _, a := range mcpAgents {
		if _, err := a.callTask(ctx, map[string]any{"seconds": o.Seconds}); err != nil {
			return nil, fmt.Errorf("bench: warm-up tools/call: %w", err)
		}
	}
	for _, a := range natsAgents {
		if _, err := a.request(ctx, o.Seconds); err != nil {
			return nil, fmt.Errorf("bench: warm-up wait.request: %w", err)
		}
	}

	progress("%d tools/call wait {seconds: %d}, %d at once", o.N, o.Seconds, o.Clients)
	wire := make([][]time.Duration, o.Clients)
	live := make([][]string, o.Clients)
	res.Handle = phase(ctx, o.N, o.Clients, func(ctx context.Context, c, i int) error {
		a := mcpAgents[c]
		t, err := a.callTask(ctx, map[string]any{"seconds": o.Seconds})
		if err != nil {
			return err
		}
		if t.Status != "working" {
			return fmt.Errorf("task %s is %s", t.TaskID, t.Status)
		}
		wire[c] = append(wire[c], a.rt.lastWire())
		live[c] = append(live[c], t.TaskID)
		return nil
	})
	res.HandleWireMs = summarize(slices.Concat(wire...))

	if o.Gets > 0 {
		progress("%d tasks/get on live tasks, %d at once", o.Gets, o.Clients)
		res.Get = phase(ctx, o.Gets, o.Clients, func(ctx context.Context, c, i int) error {
			ids := live[c]
			if len(ids) == 0 {
				return errors.New("no live task")
			}
			t, err := mcpAgents[c].get(ctx, ids[(i/o.Clients)%len(ids)])
			if err != nil {
				return err
			}
			if t.Status != "working" {
				return fmt.Errorf("task %s is %s", t.TaskID, t.Status)
			}
			return nil
		})
	}
	progress("tasks/cancel of the %d tasks", o.N)
	next := make([]atomic.Int64, o.Clients)
	res.Cancel = phase(ctx, o.N, o.Clients, func(ctx context.Context, c, i int) error {
		k := int(next[c].Add(1) - 1)
		if k >= len(live[c]) {
			return errors.New("no task left to cancel")
		}
		return mcpAgents[c].cancel(ctx, live[c][k])
	})

	progress("%d wait.request {seconds: %d} over NATS, %d at once", o.N, o.Seconds, o.Clients)
	waitIDs := make([][]string, o.Clients)
	res.NATSRequest = phase(ctx, o.N, o.Clients, func(ctx context.Context, c, i int) error {
		reply, err := natsAgents[c].request(ctx, o.Seconds)
		if err != nil {
			return err
		}
		waitIDs[c] = append(waitIDs[c], reply.WaitID)
		return nil
	})
	progress("wait.cancel of the %d waits", o.N)
	next = make([]atomic.Int64, o.Clients)
	res.NATSCancel = phase(ctx, o.N, o.Clients, func(ctx context.Context, c, i int) error {
		k := int(next[c].Add(1) - 1)
		if k >= len(waitIDs[c]) {
			return errors.New("no wait left to cancel")
		}
		return natsAgents[c].cancelWait(ctx, waitIDs[c][k])
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	if o.Visible > 0 {
		progress("%d waits of %ds per way, %d agents per way, every way at once", o.Visible, o.WaitSeconds, o.VisibleClients)
		if err := visible(ctx, f, o, res); err != nil {
			return nil, err
		}
	}
	res.PeakRSSBytes = peakRSS()
	return res, nil
}

// phase makes n calls, clients at once (call i on client i%clients), and
// times each; a failed call is counted, not fatal.
func phase(ctx context.Context, n, clients int, call func(ctx context.Context, c, i int) error) MCPPhase {
	lats := make([][]time.Duration, clients)
	var errs atomic.Int64
	var first sync.Once
	p := MCPPhase{N: n}
	cpu0 := processCPU()
	start := time.Now()
	var g errgroup.Group
	for c := range clients {
		g.Go(func() error {
			for i := c; i < n; i += clients {
				if ctx.Err() != nil {
					return nil
				}
				t0 := time.Now()
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := call(cctx, c, i)
				cancel()
				if err != nil {
					errs.Add(1)
					first.Do(func() { p.FirstErr = err.Error() })
					continue
				}
				lats[c] = append(lats[c], time.Since(t0))
			}
			return nil
		})
	}
	_ = g.Wait()
	p.PerS = float64(n) / time.Since(start).Seconds()
	p.CPUMsPerCall = ms(processCPU()-cpu0) / float64(n)
	p.LatencyMs = summarize(slices.Concat(lats...))
	p.Errors = int(errs.Load())
	return p
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// WriteText prints a result for people.
func (r *MCPResult) WriteText(w io.Writer) {
	auth := "agent tokens (HTTP bearer, NATS auth callout)"
	if !r.Tokens {
		auth = "no tokens (open on loopback)"
	}
	fmt.Fprintf(w, "mcp: n=%d clients=%d, long waits of %ds, %s\n", r.N, r.Clients, r.Seconds, auth)
	fmt.Fprintf(w, "http client: %s\n", r.HTTPClient)
	fmt.Fprintf(w, "%-36s %7s %9s %8s %8s %8s %8s %8s %6s\n", "call (ms)", "n", "per s", "p50", "p90", "p99", "max", "cpu/call", "errors")
	row := func(name string, p MCPPhase) {
		fmt.Fprintf(w, "%-36s %7d %9.0f %8.2f %8.2f %8.2f %8.2f %8.2f %6d\n", name, p.N, p.PerS,
			p.LatencyMs.P50, p.LatencyMs.P90, p.LatencyMs.P99, p.LatencyMs.Max, p.CPUMsPerCall, p.Errors)
	}
	row("MCP tools/call wait -> task handle", r.Handle)
	fmt.Fprintf(w, "%-36s %7s %9s %8.2f %8.2f %8.2f %8.2f\n", "  of which the HTTP round trip", "", "",
		r.HandleWireMs.P50, r.HandleWireMs.P90, r.HandleWireMs.P99, r.HandleWireMs.Max)
	row("NATS wait.request -> reply", r.NATSRequest)
	row("MCP tasks/get (live task)", r.Get)
	row("MCP tasks/cancel", r.Cancel)
	row("NATS wait.cancel", r.NATSCancel)
	fmt.Fprintln(w, "(cpu/call: the process's CPU ms per call, bench client, replica and embedded server together)")
	if len(r.Visible) == 0 {
		fmt.Fprintf(w, "peak rss (bench and replica): %.1f MiB\n", float64(r.PeakRSSBytes)/(1<<20))
		return
	}
	fmt.Fprintf(w, "\nwait {seconds: %d}: target -> end seen by the client, ms (poll %dms; the server suggested %v ms)\n",
		r.WaitSeconds, r.PollMs, r.ServerPollMs)
	fmt.Fprintf(w, "%-22s %5s %8s %8s %8s %8s %9s %9s %7s  %s\n", "way", "n", "p50", "p90", "p99", "max", "fire p50", "fire p99", "calls", "how")
	for _, v := range r.Visible {
		fire50, fire99, calls := "-", "-", "-"
		if v.FireMs != nil {
			fire50, fire99 = fmt.Sprintf("%.2f", v.FireMs.P50), fmt.Sprintf("%.2f", v.FireMs.P99)
		}
		if v.CallsPerWait > 0 {
			calls = fmt.Sprintf("%.1f", v.CallsPerWait)
		}
		fmt.Fprintf(w, "%-22s %5d %8.2f %8.2f %8.2f %8.2f %9s %9s %7s  %s\n", v.Way, v.N,
			v.LatenessMs.P50, v.LatenessMs.P90, v.LatenessMs.P99, v.LatenessMs.Max, fire50, fire99, calls, v.How)
		if v.Missed > 0 {
			fmt.Fprintf(w, "%-22s missed %d: %s\n", "", v.Missed, v.FirstErr)
		}
	}
	fmt.Fprintf(w, "peak rss (bench and replica): %.1f MiB\n", float64(r.PeakRSSBytes)/(1<<20))
}
