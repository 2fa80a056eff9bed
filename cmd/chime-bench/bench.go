package main

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
	"strings"
	"syscall"
	"time"

	"github.com/chime-nats/chime/bench"
	"github.com/chime-nats/chime/notifications"
)

const benchUsage = `chime-bench timers [-n N] [-c C] [--lead D] [--spread D] [--hold] [--peer] [--auth] [--agent-tokens] [--fire-cpuprofile F] [--create-cpuprofile F] [--json]
       chime-bench waits [-n N] [--agents N] [-c C] [--lead D] [--spread D] [--timers N] [--json]
       chime-bench callbacks [-n N] [-c CONNS] [--wakes N] [--auth] [--nats] [--json]
       chime-bench connect [-n N] [-c C] [--as agent|operator] [--json]
       chime-bench history [-n N] [--rounds R] [--agents A] [-c C] [--dedup-window D] [--retention D] [--settle D] [--heapprofile F] [--json]
       chime-bench waitfor [-n N] [--agents N] [-c C] [--rate R] [--json]
       chime-bench notify [--rate R] [--duration D] [--agents N] [--clients N] [--prefill [--limit N]] [--http URL] [--json]
       chime-bench notify-memory [--servers 1|3] [--replicas N] [--agents A] [--per-agent K] [--detail-bytes D] [--lists N] [--max-rss B] [--exe PATH] [--json]
       chime-bench chaos [--servers 1|3] [--replicas N] [--duration D] [--rate R] [--every D]
                         [--kill replica,server,leader | --partition inbox-leader,timers-leader,replica,node]
                         [--down D] [--exe PATH] [--json] (see chime-bench chaos --help)
       chime-bench scale [--servers 1|3] [--replicas 1,2,3] [--partitions P] [-n N] [--agents A] [-c C] [--lead D] [--profile DIR] [--exe PATH] [--json]
       chime-bench capacity [--servers 1|3] [--replicas 1,2,3] [--timers N] [--agents A] [-c C] [--exe PATH] [--json]
       chime-bench tasks [--output-mib N] [--concurrent N] [--timer-every D] [--embedded] [--exe PATH] [--json]
       chime-bench inbox [--agents N] [-c C] [--conns N] [--lead D] [--max N] [--timeout D] [--restart=false] [--keep] [--profile DIR] [--exe PATH] [--json]
       chime-bench mcp [-n N] [-c C] [--seconds S] [--gets N] [--visible N] [--visible-c C] [--wait S] [--poll D] [--tokens=false] [--json]
       chime-bench monitor [--rate R] [--duration D] [--flood D] [--flood-rate R] [--grace D] [--keep] [--exe PATH] [--json]
       chime-bench soak [--duration D] [--rate R] [--agents N] [--lead D] [--every D] [--notify-rate R] [-c C] [--grace D] [--exe PATH] [--json]

mcp runs its own chime in-process (an embedded server) and drives the agents' MCP endpoint.
timers, callbacks, waits and waitfor drive the chime at CHIME_NATS_URL when it is set (else one of
their own); timers, callbacks and connect connect to it with CHIME_NATS_TOKEN, an operator's token
where NATS authorization is on. The benches that run chime replicas as processes (chaos, scale,
capacity, notify-memory, tasks, inbox, monitor, soak) run --exe, default the chime binary beside chime-bench,
else chime on PATH (go build -o DIR/ ./cmd/chime ./cmd/chime-bench puts both in DIR).`

func (a *app) bench(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, benchUsage)
	}
	switch args[0] {
	case "timers":
		return a.benchTimers(ctx, args[1:])
	case "waits":
		return a.benchWaits(ctx, args[1:])
	case "callbacks":
		return a.benchCallbacks(ctx, args[1:])
	case "history":
		return a.benchHistory(ctx, args[1:])
	case "waitfor":
		return a.benchWaitFor(ctx, args[1:])
	case "notify":
		return a.benchNotify(ctx, args[1:])
	case "chaos":
		return a.benchChaos(ctx, args[1:])
	case "scale":
		return a.benchScale(ctx, args[1:])
	case "capacity":
		return a.benchCapacity(ctx, args[1:])
	case "notify-memory":
		return a.benchNotifyMemory(ctx, args[1:])
	case "tasks":
		return a.benchTasks(ctx, args[1:])
	case "connect":
		return a.benchConnect(ctx, args[1:])
	case "inbox":
		return a.benchInbox(ctx, args[1:])
	case "soak":
		return a.benchSoak(ctx, args[1:])
	case "mcp":
		return a.benchMCP(ctx, args[1:])
	case "monitor":
		return a.benchMonitor(ctx, args[1:])
	}
	return fmt.Errorf("%w: %s", errUsage, benchUsage)
}

func (a *app) benchTimers(ctx context.Context, args []string) error {
	o := bench.TimersOptions{NATSURL: os.Getenv("CHIME_NATS_URL"), Token: os.Getenv("CHIME_NATS_TOKEN"), Log: a.benchLog()}
	var compare bool
	return a.runBench(ctx, "timers", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.N, "n", 10000, "timers to create")
		fs.IntVar(&o.Clients, "c", 16, "concurrent clients")
		fs.DurationVar(&o.Lead, "lead", 2e9, "first due time after the start")
		fs.DurationVar(&o.Spread, "spread", 0, "spread due times over this")
		fs.BoolVar(&o.Hold, "hold", false, "create far-future timers and report memory per active timer")
		fs.BoolVar(&o.Peer, "peer", false, "then schedule as many messages, due alike, with JetStream's own message schedules (@at) on the same server and report both")
		fs.StringVar(&o.FireProfile, "fire-cpuprofile", "", "write a CPU profile of the fire window alone (first due time to last fire) to this file")
		fs.StringVar(&o.CreateProfile, "create-cpuprofile", "", "write a CPU profile of the creates alone to this file")
		fs.BoolVar(&compare, "auth", false, authUsage)
		fs.BoolVar(&o.AgentTokens, "agent-tokens", false, "each client creates as its agent, on a connection of its own with a token issued for it (needs an operator: --auth, or CHIME_NATS_TOKEN)")
	}, func(ctx context.Context) (result, error) {
		return authRuns(ctx, compare, func(ctx context.Context, auth bool) (result, error) {
			o.Auth = auth
			if compare && !auth && o.AgentTokens {
				// No one to issue tokens without authorization: the
				// agents' own connections are measured with it on.
				off := o
				off.AgentTokens = false
				return bench.Timers(ctx, off)
			}
			return bench.Timers(ctx, o)
		})
	})
}

func (a *app) benchWaits(ctx context.Context, args []string) error {
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

func (a *app) benchCallbacks(ctx context.Context, args []string) error {
	o := bench.CallbacksOptions{NATSURL: os.Getenv("CHIME_NATS_URL"), Token: os.Getenv("CHIME_NATS_TOKEN"), Log: a.benchLog()}
	var compare bool
	return a.runBench(ctx, "callbacks", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.N, "n", 20000, "enqueue callbacks to send")
		fs.IntVar(&o.Conns, "c", 64, "concurrent HTTP connections")
		fs.IntVar(&o.Wakes, "wakes", 1000, "wakes sent one at a time for wake-to-inbox latency")
		fs.BoolVar(&compare, "auth", false, authUsage)
		fs.BoolVar(&o.NATS, "nats", false, "send the callbacks as NATS requests (callback.enqueue, callback.wake) with the trigger's token, from connections presenting it, instead of HTTP; -c requesters over up to 4 connections")
	}, func(ctx context.Context) (result, error) {
		return authRuns(ctx, compare, func(ctx context.Context, auth bool) (result, error) {
			o.Auth = auth
			return bench.Callbacks(ctx, o)
		})
	})
}

func (a *app) benchHistory(ctx context.Context, args []string) error {
	o := bench.HistoryOptions{Log: a.benchLog()}
	return a.runBench(ctx, "history", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.N, "n", 20000, "one-shot timers created and fired per round")
		fs.IntVar(&o.Rounds, "rounds", 3, "rounds; memory per finished timer is reported after each")
		fs.IntVar(&o.Agents, "agents", 100, "agents the timers are spread over")
		fs.IntVar(&o.Clients, "c", 16, "concurrent clients")
		fs.DurationVar(&o.DedupWindow, "dedup-window", 0, "CHIME_DEDUP_WINDOW of the replica (0: its default, 10m)")
		fs.DurationVar(&o.Retention, "retention", 0, "CHIME_RECORD_RETENTION of the replica (0: its default, 168h)")
		fs.DurationVar(&o.Settle, "settle", 2*time.Second, "wait this long after each round before measuring (past 2m the server's per-block subject state has expired)")
		fs.StringVar(&o.HeapProfile, "heapprofile", "", "write a heap profile at the end to this file")
	}, func(ctx context.Context) (result, error) { return bench.History(ctx, o) })
}

func (a *app) benchWaitFor(ctx context.Context, args []string) error {
	o := bench.WaitForOptions{NATSURL: os.Getenv("CHIME_NATS_URL"), Log: a.benchLog()}
	return a.runBench(ctx, "waitfor", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.N, "n", 10000, "WaitFor registrations, each on its own task, then each task's result")
		fs.IntVar(&o.Agents, "agents", 100, "agents they belong to")
		fs.IntVar(&o.Clients, "c", 16, "concurrent clients")
		fs.Float64Var(&o.Rate, "rate", 0, "task results per second (0: as fast as the clients go, saturating the replica)")
	}, func(ctx context.Context) (result, error) { return bench.WaitFor(ctx, o) })
}

func (a *app) benchNotify(ctx context.Context, args []string) error {
	o := bench.NotifyOptions{NATSURL: os.Getenv("CHIME_NATS_URL"), Log: a.benchLog()}
	return a.runBench(ctx, "notify", args, func(fs *flag.FlagSet) {
		fs.Float64Var(&o.Rate, "rate", 1000, "notifications sent per second")
		fs.DurationVar(&o.Duration, "duration", 10*time.Second, "how long they are sent")
		fs.IntVar(&o.Agents, "agents", 100, "agents they are spread over")
		fs.IntVar(&o.Clients, "clients", 10, "SSE clients of the all-agents stream, over HTTP")
		fs.IntVar(&o.InFlight, "in-flight", 256, "notify requests awaiting their reply at most")
		fs.BoolVar(&o.Prefill, "prefill", false, "start at steady state: fill every agent to its limit, then evict 2 to 3 limits' worth, before the measure")
		fs.IntVar(&o.Limit, "limit", notifications.DefaultMax, "the chime's CHIME_NOTIFICATIONS_MAX, for --prefill")
		fs.StringVar(&o.HTTPURL, "http", "", "HTTP gateway of the chime at CHIME_NATS_URL (default: a chime of its own)")
	}, func(ctx context.Context) (result, error) { return bench.Notify(ctx, o) })
}

// benchChaos runs its own nats-servers and replicas of chime (--exe), so
// it ignores CHIME_NATS_URL.
func (a *app) benchChaos(ctx context.Context, args []string) error {
	o := bench.ChaosOptions{Log: a.benchLog(), Progress: a.Stderr}
	var kill, partition string
	var flags *flag.FlagSet
	return a.runBench(ctx, "chaos", args, func(fs *flag.FlagSet) {
		flags = fs
		fs.IntVar(&o.Servers, "servers", 3, "nats-servers: 1 (standalone) or 3 (a JetStream cluster; chime's streams at R3)")
		fs.IntVar(&o.Replicas, "replicas", 3, "chime replicas, child processes running --exe serve")
		fs.DurationVar(&o.Duration, "duration", 2*time.Minute, "how long load is applied and kills are done")
		fs.Float64Var(&o.Rate, "rate", 200, "one-shot timers created per second, each due 1-5 s later")
		fs.IntVar(&o.Agents, "agents", 20, "agents the timers and waits belong to")
		fs.IntVar(&o.Repeating, "repeating", 50, "repeating timers, created at the start and cancelled at the end")
		fs.DurationVar(&o.Interval, "interval", time.Second, "interval of the repeating timers")
		fs.IntVar(&o.Calendar, "calendar", 0, "calendar timers firing every second (cron \"* * * * * *\" in Europe/Berlin), created and cancelled with the repeating ones")
		fs.Float64Var(&o.WaitRate, "wait-rate", 5, "managed waits requested per second, 2-4 s each")
		fs.IntVar(&o.CancelEvery, "cancel-every", 10, "cancel every Nth one-shot timer before it is due (0: none)")
		fs.DurationVar(&o.Every, "every", 10*time.Second, "a kill every this")
		fs.StringVar(&kill, "kill", "replica,server,leader", "what to SIGKILL, in turn: replica (a chime replica), server (a random nats-server), "+
			"leader (the server leading CHIME_INBOX or KV_chime_timers, alternately)")
		fs.StringVar(&partition, "partition", "", "network partitions to do, in turn, instead of kills (--kill is then off unless given): "+
			"inbox-leader (cut off the server leading CHIME_INBOX), timers-leader (the server leading KV_chime_timers), "+
			"replica (a chime replica, from every server), node (a server leading neither, in turn); "+
			"each server and replica then runs in a network namespace of its own on a bridge (Linux, root, iproute2's ip; --servers 3-5)")
		fs.DurationVar(&o.Down, "down", 3*time.Second, "how long a killed process stays down before it is restarted, or a partition lasts before it heals")
		fs.DurationVar(&o.Grace, "grace", 10*time.Second, "waited after the last due time before the inbox is read")
		fs.BoolVar(&o.Keep, "keep", false, "keep the work dir (stores, server and replica logs); it is kept anyway when something was lost or duplicated")
		fs.StringVar(&o.Exe, "exe", "", exeUsage)
	}, func(ctx context.Context) (result, error) {
		killGiven := false
		flags.Visit(func(f *flag.Flag) { killGiven = killGiven || f.Name == "kill" })
		o.Partition = splitList(partition)
		if len(o.Partition) == 0 || killGiven {
			o.Kill = splitList(kill)
		}
		return bench.Chaos(ctx, o)
	})
}

// splitList splits a comma-separated flag, dropping empty items.
func splitList(v string) []string {
	var out []string
	for k := range strings.SplitSeq(v, ",") {
		if k = strings.TrimSpace(k); k != "" {
			out = append(out, k)
		}
	}
	return out
}

// benchScale runs its own nats-servers and replicas of chime, as chaos
// does. The replicas' CPU is read from /proc per phase; --profile
// takes their CPU profiles (CHIME_PPROF_ADDR), while --cpuprofile
// profiles the bench process only.
func (a *app) benchScale(ctx context.Context, args []string) error {
	o := bench.ScaleOptions{Progress: a.Stderr}
	var replicas string
	return a.runBench(ctx, "scale", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.Servers, "servers", 1, "nats-servers: 1 (standalone) or 3 (a JetStream cluster; chime's streams at R3)")
		fs.StringVar(&replicas, "replicas", "1,2,3", "replica counts to measure, each on fresh nats-servers")
		fs.IntVar(&o.Partitions, "partitions", 0, "the replicas' CHIME_PARTITIONS: 0, one bucket per kind watched whole by every replica; P, P buckets, each replica watching its shards' keys")
		fs.IntVar(&o.N, "n", 20000, "one-shot timers created, then fired, per replica count")
		fs.IntVar(&o.Agents, "agents", 100, "agents the timers are spread over")
		fs.IntVar(&o.Clients, "c", 64, "creates in flight, over 4 connections")
		fs.DurationVar(&o.Lead, "lead", 30*time.Second, "the common due time after the first create (must outlast the creates)")
		fs.StringVar(&o.ProfileDir, "profile", "", "write CPU profiles of every replica (create phase, fire phase) into this directory")
		fs.IntVar(&o.ProfileSeconds, "profile-seconds", 3, "length of each replica profile, in seconds")
		fs.StringVar(&o.Exe, "exe", "", exeUsage)
	}, func(ctx context.Context) (result, error) {
		var err error
		if o.Replicas, err = bench.ParseReplicas(replicas); err != nil {
			return nil, err
		}
		return bench.Scale(ctx, o)
	})
}

// benchNotifyMemory runs its own nats-servers and replicas (of chime, or
// --exe: a build of other code, to compare).
func (a *app) benchNotifyMemory(ctx context.Context, args []string) error {
	o := bench.NotifyMemoryOptions{Progress: a.Stderr}
	var maxRSS int64
	return a.runBench(ctx, "notify-memory", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.Servers, "servers", 1, "nats-servers: 1 (standalone) or 3 (a JetStream cluster; chime's streams at R3)")
		fs.IntVar(&o.Replicas, "replicas", 3, "chime replicas, child processes running serve")
		fs.IntVar(&o.Agents, "agents", 2000, "agents sent notifications")
		fs.IntVar(&o.PerAgent, "per-agent", 100, "notifications each agent is sent (the replicas' CHIME_NOTIFICATIONS_MAX)")
		fs.IntVar(&o.DetailBytes, "detail-bytes", 8192, "bytes of HTML detail in each notification")
		fs.IntVar(&o.InFlight, "in-flight", 32, "notify requests awaiting their reply at most")
		fs.IntVar(&o.Lists, "lists", 500, "whole histories read over HTTP after the writes, one at a time")
		fs.DurationVar(&o.Settle, "settle", 15*time.Second, "waited after the writes before memory is read")
		fs.Int64Var(&maxRSS, "max-rss", 4<<30, "stop the writes when a replica's RSS passes this many bytes (0: never)")
		fs.StringVar(&o.Exe, "exe", "", exeUsage)
	}, func(ctx context.Context) (result, error) {
		o.MaxRSS = maxRSS
		return bench.NotifyMemory(ctx, o)
	})
}

// benchCapacity runs its own nats-servers and replicas of chime.
func (a *app) benchCapacity(ctx context.Context, args []string) error {
	o := bench.CapacityOptions{Progress: a.Stderr}
	var replicas string
	return a.runBench(ctx, "capacity", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.Servers, "servers", 1, "nats-servers: 1 (standalone) or 3 (a JetStream cluster; chime's streams at R3)")
		fs.StringVar(&replicas, "replicas", "1,2,3", "replica counts to measure, each on fresh nats-servers")
		fs.IntVar(&o.Timers, "timers", 300000, "one-shot timers created, due in an hour")
		fs.IntVar(&o.Agents, "agents", 1000, "agents the timers are spread over")
		fs.IntVar(&o.Clients, "c", 64, "creates in flight, over 4 connections")
		fs.DurationVar(&o.Stable, "stable", 3*time.Second, "how long each replica's chime_timers_active must hold still before memory is read")
		fs.DurationVar(&o.Settle, "settle", 5*time.Second, "waited after that, before memory is read")
		fs.DurationVar(&o.Takeover, "takeover", 30*time.Second, "how long the survivors are given to hold every timer after one replica is SIGKILLed")
		fs.StringVar(&o.Exe, "exe", "", exeUsage)
	}, func(ctx context.Context) (result, error) {
		var err error
		if o.Replicas, err = bench.ParseReplicas(replicas); err != nil {
			return nil, err
		}
		return bench.Capacity(ctx, o)
	})
}

// benchConnect measures NATS connects through chime's auth callout: its
// own chime with authorization on, or CHIME_NATS_URL with CHIME_NATS_TOKEN.
func (a *app) benchConnect(ctx context.Context, args []string) error {
	o := bench.ConnectOptions{NATSURL: os.Getenv("CHIME_NATS_URL"), Token: os.Getenv("CHIME_NATS_TOKEN"), Log: a.benchLog()}
	return a.runBench(ctx, "connect", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.N, "n", 2000, "connects, each closed once admitted")
		fs.IntVar(&o.Clients, "c", 16, "connects in flight")
		fs.StringVar(&o.As, "as", "agent", "whose token the connects present: agent (one issued for a bench agent; the callout records each session) or operator")
	}, func(ctx context.Context) (result, error) { return bench.Connect(ctx, o) })
}

// benchTasks runs a replica of chime (--exe) as a child, so
// that its memory is its own, and ignores CHIME_NATS_URL.
func (a *app) benchTasks(ctx context.Context, args []string) error {
	o := bench.TasksOptions{Progress: a.Stderr}
	return a.runBench(ctx, "tasks", args, func(fs *flag.FlagSet) {
		fs.IntVar(&o.OutputMiB, "output-mib", 64, "each task's output, appended in 48 KiB parts")
		fs.IntVar(&o.Concurrent, "concurrent", 3, "tasks of one agent appending, reporting and reading back at once")
		fs.DurationVar(&o.TimerEvery, "timer-every", 100*time.Millisecond, "another agent creates a one-shot timer this often meanwhile")
		fs.DurationVar(&o.TimerLead, "timer-lead", time.Second, "each such timer is due this long after its create")
		fs.BoolVar(&o.Embedded, "embedded", false, "the replica embeds its NATS server (its RSS holds the server's); default a nats-server of its own, as the chart deploys")
		fs.StringVar(&o.Exe, "exe", "", exeUsage)
	}, func(ctx context.Context) (result, error) { return bench.Tasks(ctx, o) })
}

// benchSoak runs a replica of chime (--exe) as a child on its
// embedded NATS server, with the CHIME_* settings of this environment, and
// ignores CHIME_NATS_URL; a row per --every goes to stderr as it is taken.
func (a *app) benchSoak(ctx context.Context, args []string) error {
	o := bench.SoakOptions{Progress: a.Stderr}
	return a.runBench(ctx, "soak", args, func(fs *flag.FlagSet) {
		fs.DurationVar(&o.Duration, "duration", 10*time.Minute, "how long timers are created")
		fs.Float64Var(&o.Rate, "rate", 200, "one-shot timers created per second, round-robin over the agents")
		fs.IntVar(&o.Agents, "agents", 200, "agents, each reading its inbox reliably (inbox.fetch with a wait, inbox.ack)")
		fs.DurationVar(&o.Lead, "lead", 5*time.Second, "each timer is due this long after its create")
		fs.DurationVar(&o.Every, "every", time.Minute, "a row (RSS, heap, goroutines, fires, lateness) this often")
		fs.Float64Var(&o.NotifyRate, "notify-rate", 20, "notifications per second, each to an agent at random (0: none)")
		fs.IntVar(&o.InFlight, "c", 64, "creates (and notifies) in flight at most")
		fs.DurationVar(&o.Grace, "grace", 30*time.Second, "a fire not read this long after its due time counts as missed")
		fs.StringVar(&o.Exe, "exe", "", exeUsage)
	}, func(ctx context.Context) (result, error) { return bench.Soak(ctx, o) })
}

// exeUsage is the --exe flag of the benches that run chime replicas.
const exeUsage = "the chime binary run as `serve` (default: chime beside chime-bench, else on PATH), e.g. another build to compare"

const authUsage = "run twice in this process, with NATS authorization off and then on (the bench connects as an operator through chime's auth callout), and report both"

// authRuns runs one benchmark, or with compare the pair of runs without
// and with NATS authorization.
func authRuns(ctx context.Context, compare bool, run func(context.Context, bool) (result, error)) (result, error) {
	if !compare {
		return run(ctx, false)
	}
	off, err := run(ctx, false)
	if err != nil {
		return nil, err
	}
	on, err := run(ctx, true)
	if err != nil {
		return nil, err
	}
	return authPair{Off: off, On: on}, nil
}

// authPair is a benchmark run without and with NATS authorization.
type authPair struct {
	Off result `json:"auth_off"`
	On  result `json:"auth_on"`
}

func (p authPair) WriteText(w io.Writer) {
	fmt.Fprintln(w, "NATS authorization off:")
	p.Off.WriteText(w)
	fmt.Fprintln(w, "NATS authorization on (operator token, auth callout):")
	p.On.WriteText(w)
}

// result is a benchmark's printable outcome.
type result interface{ WriteText(io.Writer) }

// failer is a result that can say the run failed, after it is printed: the
// exit status is then non-zero.
type failer interface{ Err() error }

func (a *app) benchLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(a.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// runBench parses a benchmark's flags (its own, from flags, and --json
// and --cpuprofile), runs fn under the optional CPU profile, stopping on
// Ctrl-C, and prints its result.
func (a *app) runBench(ctx context.Context, name string, args []string, flags func(*flag.FlagSet), fn func(context.Context) (result, error)) error {
	fs := flag.NewFlagSet("chime-bench "+name, flag.ContinueOnError)
	fs.SetOutput(a.Stderr)
	flags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
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
	// SIGTERM too: a bench ended by a supervisor must still stop its
	// processes and delete what it made (chaos --partition's namespaces).
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := fn(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := json.NewEncoder(a.Stdout).Encode(res); err != nil {
			return err
		}
	} else {
		res.WriteText(a.Stdout)
	}
	if f, ok := res.(failer); ok {
		return f.Err()
	}
	return nil
}
