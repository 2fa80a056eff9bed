package main

import (
	"context"
	"flag"
	"time"

	"github.com/chime-nats/chime/bench"
)

// benchInbox runs its own nats-server and a replica of chime, as
// scale does, so that the server can be SIGKILLed and restarted on its
// store; it ignores CHIME_NATS_URL.
func (a *app) benchInbox(ctx context.Context, args []string) error {
	o := bench.InboxOptions{Progress: a.Stderr}
	return a.runBench(ctx, "inbox", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.Agents, "agents", 10000, "agents, one timer each, each reading its inbox reliably (inbox.fetch, inbox.ack)")
		fs.IntVar(&o.InFlight, "c", 256, "requests in flight (creates, then fetches and acks)")
		fs.IntVar(&o.Conns, "conns", 8, "bench connections the requests are spread over")
		fs.DurationVar(&o.Lead, "lead", 0, "every timer is due this long after the first create (must outlast the creates; 0: 5s plus 0.3ms per agent)")
		fs.IntVar(&o.Max, "max", 16, "a fetch's max")
		fs.DurationVar(&o.Timeout, "timeout", 2*time.Second, "a fetch's or ack's time out: a request lost in the kill is sent again after it")
		fs.BoolVar(&o.Restart, "restart", true, "SIGKILL the nats-server when half the agents have read, and restart it on its store")
		fs.BoolVar(&o.Keep, "keep", false, "keep the work dir (the server's store, server and replica logs); it is kept anyway when the run fails")
		fs.StringVar(&o.ProfileDir, "profile", "", "write a CPU profile of the replica from the due time into this directory")
		fs.IntVar(&o.ProfileSeconds, "profile-seconds", 10, "length of the replica profile, in seconds")
		fs.StringVar(&o.Exe, "exe", "", exeUsage)
	}, func(ctx context.Context) (result, error) { return bench.Inbox(ctx, o) })
}
