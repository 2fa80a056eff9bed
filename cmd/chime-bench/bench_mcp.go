package main

import (
	"context"
	"flag"
	"time"

	"github.com/chime-nats/chime/bench"
)

// benchMCP runs a replica of chime in-process, on its embedded NATS
// server, with its HTTP listener on loopback, and ignores CHIME_NATS_URL:
// the agents' MCP server (/api/agents/{id}/mcp) is driven by the go-sdk
// client with the Tasks extension, next to the same waits over NATS.
func (a *app) benchMCP(ctx context.Context, args []string) error {
	o := bench.MCPOptions{Log: a.benchLog(), Progress: a.Stderr}
	return a.runBench(ctx, "mcp", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.N, "n", 2000, "tools/call wait answered with a task handle (and as many wait.request over NATS, and tasks/cancel and wait.cancel of them)")
		fs.IntVar(&o.Clients, "c", 16, "agents calling at once, each with its own MCP session and http.Client (keep-alive) and its own NATS connection")
		fs.IntVar(&o.Seconds, "seconds", 3600, "the handles' waits' length, in seconds: they stay live for tasks/get, then are cancelled")
		fs.IntVar(&o.Gets, "gets", 2000, "tasks/get on the live tasks")
		fs.IntVar(&o.Visible, "visible", 100, "short waits per way of seeing their end (MCP polling fast, MCP polling at the suggested interval, MCP blocking, NATS inbox subscription, NATS inbox.fetch), every way at once (0: none)")
		fs.IntVar(&o.VisibleClients, "visible-c", 5, "agents per way, each waiting one short wait after another")
		fs.IntVar(&o.WaitSeconds, "wait", 1, "the short waits' length, in seconds")
		fs.DurationVar(&o.Poll, "poll", 50*time.Millisecond, "the fast poller's tasks/get interval")
		fs.BoolVar(&o.Tokens, "tokens", true, "authorization on: each agent presents a token issued for it (HTTP bearer, NATS auth callout); false: open on loopback")
	}, func(ctx context.Context) (result, error) { return bench.MCP(ctx, o) })
}
