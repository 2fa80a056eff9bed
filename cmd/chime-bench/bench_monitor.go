package main

import (
	"context"
	"flag"
	"time"

	"github.com/chime-nats/chime/bench"
)

// benchMonitor runs its own nats-server and a replica of chime (--exe),
// with CHIME_MONITOR_SUBJECTS=monbench.{agent}.>, and runs --exe's
// `monitor run` as a command monitor's executor; it ignores
// CHIME_NATS_URL.
func (a *app) benchMonitor(ctx context.Context, args []string) error {
	o := bench.MonitorOptions{Progress: a.Stderr}
	return a.runBench(ctx, "monitor", args, func(fs *flag.FlagSet) {
		fs.Float64Var(&o.Rate, "rate", 5, "latency: lines per second to each of three monitors (a subject, monitor.emit, chime monitor run), at most 10 (a monitor's refill rate)")
		fs.DurationVar(&o.Duration, "duration", 30*time.Second, "latency: how long the lines are sent")
		fs.Float64Var(&o.FloodRate, "flood-rate", 1000, "flood: messages per second published on one subject monitor's subject")
		fs.DurationVar(&o.Flood, "flood", 20*time.Second, "flood: how long (0: no flood; above 30s the monitor's flood stop fires)")
		fs.DurationVar(&o.Grace, "grace", 3*time.Second, "waited after a phase's last line for its envelopes")
		fs.BoolVar(&o.Keep, "keep", false, "keep the work dir (the server's store, server and replica logs); it is kept anyway when the run fails")
		fs.StringVar(&o.Exe, "exe", "", exeUsage)
	}, func(ctx context.Context) (result, error) { return bench.Monitor(ctx, o) })
}
