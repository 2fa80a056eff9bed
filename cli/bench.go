package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"

	"github.com/chime-nats/chime/bench"
)

const benchUsage = `chime bench timers [-n N] [-c C] [--lead D] [--spread D] [--hold] [--json]
       chime bench waits [-n N] [--agents N] [-c C] [--lead D] [--spread D] [--timers N] [--json]
       chime bench callbacks [-n N] [-c CONNS] [--wakes N] [--json]`

func (a *App) bench(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", ErrUsage, benchUsage)
	}
	switch args[0] {
	case "timers":
		return a.benchTimers(ctx, args[1:])
	case "waits":
		return a.benchWaits(ctx, args[1:])
	case "callbacks":
		return a.benchCallbacks(ctx, args[1:])
	}
	return fmt.Errorf("%w: %s", ErrUsage, benchUsage)
}

func (a *App) benchTimers(ctx context.Context, args []string) error {
	o := bench.TimersOptions{NATSURL: os.Getenv("CHIME_NATS_URL"), Log: a.benchLog()}
	return a.runBench(ctx, "timers", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.N, "n", 10000, "timers to create")
		fs.IntVar(&o.Clients, "c", 16, "concurrent clients")
		fs.DurationVar(&o.Lead, "lead", 2e9, "first due time after the start")
		fs.DurationVar(&o.Spread, "spread", 0, "spread due times over this")
		fs.BoolVar(&o.Hold, "hold", false, "create far-future timers and report memory per active timer")
	}, func(ctx context.Context) (result, error) { return bench.Timers(ctx, o) })
}

func (a *App) benchWaits(ctx context.Context, args []string) error {
	o := bench.WaitsOptions{NATSURL: os.Getenv("CHIME_NATS_URL"), Log: a.benchLog()}
	return a.runBench(ctx, "waits", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.N, "n", 10000, "waits to register")
		fs.IntVar(&o.Agents, "agents", 100, "agents the waits belong to")
		fs.IntVar(&o.Clients, "c", 16, "concurrent clients")
		fs.DurationVar(&o.Lead, "lead", 8e9, "first target after the start (must outlast the registrations)")
		fs.DurationVar(&o.Spread, "spread", 4e9, "spread targets over this")
		fs.IntVar(&o.Timers, "timers", 2000, "timers fired alone and while the waits run (0: none)")
	}, func(ctx context.Context) (result, error) { return bench.Waits(ctx, o) })
}

func (a *App) benchCallbacks(ctx context.Context, args []string) error {
	o := bench.CallbacksOptions{NATSURL: os.Getenv("CHIME_NATS_URL"), Log: a.benchLog()}
	return a.runBench(ctx, "callbacks", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.N, "n", 20000, "enqueue callbacks to send")
		fs.IntVar(&o.Conns, "c", 64, "concurrent HTTP connections")
		fs.IntVar(&o.Wakes, "wakes", 1000, "wakes sent one at a time for wake-to-inbox latency")
	}, func(ctx context.Context) (result, error) { return bench.Callbacks(ctx, o) })
}

// result is a benchmark's printable outcome.
type result interface{ WriteText(io.Writer) }

func (a *App) benchLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(a.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// runBench parses a benchmark's flags (its own, from flags, and --json
// and --cpuprofile), runs fn under the optional CPU profile, stopping on
// Ctrl-C, and prints its result.
func (a *App) runBench(ctx context.Context, name string, args []string, flags func(*flag.FlagSet), fn func(context.Context) (result, error)) error {
	fs := flag.NewFlagSet("bench "+name, flag.ContinueOnError)
	fs.SetOutput(a.Stderr)
	flags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	res, err := fn(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(a.Stdout).Encode(res)
	}
	res.WriteText(a.Stdout)
	return nil
}
