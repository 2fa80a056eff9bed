package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"

	"github.com/chime-nats/chime/bench"
)

func (a *App) bench(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "timers" {
		return fmt.Errorf("%w: chime bench timers [-n N] [-c C] [--lead D] [--spread D] [--hold] [--json]", ErrUsage)
	}
	fs := flag.NewFlagSet("bench timers", flag.ContinueOnError)
	fs.SetOutput(a.Stderr)
	o := bench.TimersOptions{NATSURL: os.Getenv("CHIME_NATS_URL")}
	fs.IntVar(&o.N, "n", 10000, "timers to create")
	fs.IntVar(&o.Clients, "c", 16, "concurrent clients")
	fs.DurationVar(&o.Lead, "lead", 2e9, "first due time after the start")
	fs.DurationVar(&o.Spread, "spread", 0, "spread due times over this")
	fs.BoolVar(&o.Hold, "hold", false, "create far-future timers and report memory per active timer")
	asJSON := fs.Bool("json", false, "print one JSON object")
	cpu := fs.String("cpuprofile", "", "write a CPU profile to this file")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	o.Log = slog.New(slog.NewTextHandler(a.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if *cpu != "" {
		f, err := os.Create(*cpu)
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
	res, err := bench.Timers(ctx, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(a.Stdout).Encode(res)
	}
	res.WriteText(a.Stdout)
	return nil
}
