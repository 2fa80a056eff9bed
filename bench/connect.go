package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/client"
)

// ConnectOptions configures a connect benchmark.
type ConnectOptions struct {
	N       int // connects, each closed once it is admitted
	Clients int // connects in flight
	// As is whose token the connects present: "agent" (a token issued for
	// one agent: the auth callout resolves it and records the session) or
	// "operator" (the operator token itself: no session record).
	As string
	// NATSURL and Token (an operator's) name the chime to drive; without
	// NATSURL the bench runs its own, with NATS authorization on.
	NATSURL, Token string
	Log            *slog.Logger
}

// Validate checks the options.
func (o *ConnectOptions) Validate() error {
	switch {
	case o.N <= 0:
		return errors.New("bench: -n must be positive")
	case o.Clients <= 0:
		return errors.New("bench: -c must be positive")
	case o.As != "agent" && o.As != "operator":
		return fmt.Errorf("bench: --as must be agent or operator, not %q", o.As)
	case o.NATSURL != "" && o.Token == "":
		return errors.New("bench: connect measures NATS authorization: set CHIME_NATS_TOKEN (an operator's) with CHIME_NATS_URL")
	}
	return nil
}

// ConnectResult is what a connect benchmark measured.
type ConnectResult struct {
	N            int     `json:"n"`
	Clients      int     `json:"clients"`
	As           string  `json:"as"`
	ConnectsPerS float64 `json:"connects_per_s"`
	// LatencyMs is nats.Connect's return: TCP, CONNECT, the server's auth
	// callout round trip to chime, and the first PONG.
	LatencyMs Latency `json:"latency_ms"`
	Errors    int     `json:"errors"`
	FirstErr  string  `json:"first_error,omitempty"`
}

// connectWarmup connects this many times, unmeasured, before the measure.
const connectWarmup = 20

// Connect runs the benchmark: N connects with Clients in flight, each closed
// as soon as it is admitted.
func Connect(ctx context.Context, o ConnectOptions) (*ConnectResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	url, auth, stop, err := target(ctx, o.NATSURL, o.Token, o.NATSURL == "", o.Log)
	if err != nil {
		return nil, err
	}
	defer stop()
	opts := auth
	if o.As == "agent" {
		op, err := nats.Connect(url, append(auth, nats.Name("chime-bench operator"))...)
		if err != nil {
			return nil, fmt.Errorf("bench: connect: %w", err)
		}
		agent := fmt.Sprintf("cn%d", time.Now().UnixNano()%1e9)
		tok, err := issueToken(ctx, op, agent)
		op.Close()
		if err != nil {
			return nil, err
		}
		opts = client.ConnectOptions(agent, tok)
	}
	opts = append(opts, nats.Name("chime-bench connect"), nats.NoReconnect(), nats.Timeout(10*time.Second))
	connect := func() error {
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			return err
		}
		nc.Close()
		return nil
	}
	for range connectWarmup {
		if err := connect(); err != nil {
			return nil, fmt.Errorf("bench: connect: %w", err)
		}
	}

	res := &ConnectResult{N: o.N, Clients: o.Clients, As: o.As}
	lat := make([]time.Duration, 0, o.N)
	lats := make([][]time.Duration, o.Clients)
	var errs atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for c := range o.Clients {
		g.Go(func() error {
			for i := c; i < o.N; i += o.Clients {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				t0 := time.Now()
				if err := connect(); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				lats[c] = append(lats[c], time.Since(t0))
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	res.ConnectsPerS = float64(o.N) / time.Since(start).Seconds()
	for _, l := range lats {
		lat = append(lat, l...)
	}
	res.LatencyMs = summarize(lat)
	res.Errors = int(errs.Load())
	if e, ok := firstErr.Load().(string); ok {
		res.FirstErr = e
	}
	return res, nil
}

// Err reports a run in which some connects failed.
func (r *ConnectResult) Err() error {
	if r.Errors > 0 {
		return fmt.Errorf("bench: %d of %d connects failed, the first: %s", r.Errors, r.N, r.FirstErr)
	}
	return nil
}

// WriteText prints a result for people.
func (r *ConnectResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "connect: n=%d clients=%d as %s\n", r.N, r.Clients, r.As)
	fmt.Fprintf(w, "connects/s: %.0f\n", r.ConnectsPerS)
	fmt.Fprintf(w, "connect latency ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", r.LatencyMs.P50, r.LatencyMs.P90, r.LatencyMs.P99, r.LatencyMs.Max)
	fmt.Fprintf(w, "errors: %d\n", r.Errors)
}
