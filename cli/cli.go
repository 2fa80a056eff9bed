// Package cli owns chime's command line: serve, the commands written out
// by hand (timer, wait, agent, callback, question, notify, task run, inbox
// and inbox watch, nats-config, version) and one command for every other action of the
// action table (actions.go), its lists shown as tables (table.go). The
// benchmarks are a command of their own, cmd/chime-bench. Commands other than serve speak NATS to CHIME_NATS_URL
// (default the local embedded server's address), as any agent would.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/replica"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// ErrUsage marks a command line that could not be understood.
var ErrUsage = errors.New("usage")

// App is the command line with its streams, so tests can run it in-process.
type App struct {
	Stdout, Stderr io.Writer
	Version        string
	// token is the NATS connect token of the commands that speak NATS
	// (--token, default CHIME_NATS_TOKEN).
	token string
	// flagsSaid is set once a flag set has written to Stderr (a bad flag
	// and the usage): Run then returns a bare ErrUsage.
	flagsSaid bool
}

// saying notes that what w is given has been said to the user.
type saying struct {
	w    io.Writer
	said *bool
}

func (s saying) Write(p []byte) (int, error) {
	*s.said = true
	return s.w.Write(p)
}

const usage = `chime: timers, waits, callbacks, tasks, questions and notifications for AI agents over NATS

Usage:
  chime serve                      run chime (see chime serve --help)
  chime timer create --after-ms N [--every-ms N] [--summary TEXT] [--request-id ID] [--agent ID]
  chime timer list [--limit N] [--cursor C | --all] [--json] [--agent ID]   a table; --json for scripts
  chime timer create --cron EXPR [--tz ZONE] [--dst-repeated first|last|both] [--dst-skipped shift|skip]
                    [--catchup skip|one|all] [--catchup-window-ms N] [--jitter SHARE] [--jitter-max-ms N]
                    [--start-at T] [--end-at T] [--max-fires N] [--summary TEXT] [--agent ID]
                                   a calendar timer: cron (5 or 6 fields, @daily...) in an IANA zone
  chime timer get ID [--agent ID]
  chime timer cancel ID [--agent ID]
  chime timer pause|resume ID [note=TEXT] [--agent ID]
  chime timer next ID [count=N] [--agent ID]   the next fires: scheduled time, fire time
  chime wait --seconds N | --minutes N | --until T [--tz ZONE] [--agent ID]
  chime inbox [--follow] [--ack] [--after SEQ] [--max N] [--agent ID]
                                   the agent's deliveries after its cursor, a JSON line each; --follow
                                   keeps printing them, --ack moves the cursor
  chime inbox watch [--json] [--agent ID]   for a monitor (Claude Code's Monitor): a line per
                                   delivery as it is stored, acked once printed; resumes after
                                   the last line acked, rides out chime and NATS restarts
  chime mcp [--agent ID] [--url URL] [--token T]
                                   the agent's MCP server on stdin/stdout (for clients that launch
                                   servers), carried to chime's HTTP endpoint (CHIME_URL, default
                                   http://127.0.0.1:8080) with the agent's token (CHIME_TOKEN)
  chime agent start|stop [--agent ID]   stop: its callbacks (triggers revoked); to interrupt its turn: chime intervene action=stop
  chime task run [--agent ID] [--id TASK] [--title T] -- CMD ARGS...
                                   run CMD as a task: prints {"task_id"} at once, streams its output to
                                   the task, reports completed|failed (exit_code)|interrupted, prints the
                                   record; stays in the foreground until CMD ends (background it with &)
  chime monitor run [--agent ID] [--id MON] [--description D] [--match RE] [--exclude RE]
                    [--timeout-ms N | --persistent] [--max-events N] [--idle-timeout-ms N] -- CMD ARGS...
                                   run CMD as a monitor's source: prints {"monitor_id"} at once, sends
                                   each stdout line as an event (batched within 200 ms), stops the
                                   monitor with CMD's exit code when it ends and CMD when the monitor
                                   is stopped; prints the record (background it with &)
  chime agent token [--revoke] [--agent ID]   issue (print once) or revoke the agent's tokens
  chime nats-config --dir DIR      write chime's NATS keys to DIR, print the servers' authorization
  chime backup --out DIR | restore --from DIR [--replace]   every stream and bucket (see --help)
  chime callback reset [--mode wake_hint|enqueue_message] [--agent ID]
  chime callback create [--mode M] [--label L] [--agent ID]
  chime callback cancel ID [--agent ID]
  chime callback list [--agent ID]
  chime question list [--all] [--json] [--agent ID]
  chime question answer QID [--agent ID] ANSWER...   one answer per question title, in order
  chime notify send MESSAGE [--title T] [--detail HTML] [--type T] [--priority 10|20] [--timeout S] [--id ID] [--group G] [--agent ID]
  chime notify list [--since SEQ] [--agent ID]     the history, oldest first; with --since only the changes
  chime notify read [ID...] [--agent ID]           mark read (no ID: all); operators
  chime notify clear [--agent ID]                  remove all, new guid; operators
  chime notify follow [--since SEQ] [--agent ID]   print each change (JSON lines) until Ctrl-C
  chime version

Commands that speak NATS take --token T (default CHIME_NATS_TOKEN): an agent's or an operator's.
Over TLS they verify the server with CHIME_NATS_TLS_CA and present CHIME_NATS_TLS_CLIENT_CERT/_KEY.
`

// Run executes one command line (without the program name).
func (a *App) Run(ctx context.Context, args []string) error {
	err := a.run(ctx, args)
	if a.flagsSaid && errors.Is(err, ErrUsage) {
		// The flag package has said what was wrong, with the flags: once
		// is enough.
		return ErrUsage
	}
	return err
}

func (a *App) run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(a.Stderr, usage)
		return ErrUsage
	}
	if act, rest := findAction(actionTable(), args); act != nil {
		return a.runAction(ctx, act, rest)
	}
	switch args[0] {
	case "serve":
		return a.serve(ctx, args[1:])
	case "timer":
		return a.timer(ctx, args[1:])
	case "wait":
		return a.wait(ctx, args[1:])
	case "agent":
		return a.agent(ctx, args[1:])
	case "callback":
		return a.callback(ctx, args[1:])
	case "question":
		return a.question(ctx, args[1:])
	case "notify":
		return a.notify(ctx, args[1:])
	case "task":
		return a.task(ctx, args[1:])
	case "monitor":
		return a.monitor(ctx, args[1:])
	case "inbox":
		return a.inbox(ctx, args[1:])
	case "mcp":
		return a.mcpStdio(ctx, args[1:])
	case "backup", "restore":
		return a.backupCommand(ctx, args)
	case "nats-config":
		return a.natsConfig(args[1:])
	case "version", "--version":
		fmt.Fprintln(a.Stdout, a.Version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(a.Stdout, usage)
		actionsUsage(a.Stdout, actionTable())
		return nil
	}
	fmt.Fprint(a.Stderr, usage)
	return fmt.Errorf("%w: unknown command %q", ErrUsage, args[0])
}

func (a *App) serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(a.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(a.Stdout, "Usage: chime serve\n\nRuns chime. Configuration comes from the environment:\n\n")
		_ = config.Usage(a.Stdout)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	cfg, err := config.Load()
	if err != nil {
		return err
	}
	log := newLogger(a.Stderr, cfg)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := replica.Start(ctx, cfg, log, a.Version)
	if err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.Stop(sctx)
	return nil
}

func newLogger(w io.Writer, cfg *config.Config) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// natsURL is where CLI commands connect: CHIME_NATS_URL, else the local
// embedded server's address.
func natsURL() string {
	if u := os.Getenv("CHIME_NATS_URL"); u != "" {
		return u
	}
	if l := os.Getenv("CHIME_NATS_LISTEN"); l != "" {
		return "nats://" + l
	}
	return "nats://127.0.0.1:4222"
}

func (a *App) connect(opts ...nats.Option) (*nats.Conn, error) {
	if c := os.Getenv("CHIME_NATS_CREDS"); c != "" {
		opts = append(opts, nats.UserCredentials(c))
	}
	if a.token != "" {
		opts = append(opts, nats.Token(a.token))
	}
	// The CA that verifies the server and the client certificate, as serve
	// uses them for CHIME_NATS_URL.
	opts = append(opts, engine.TLSOptions(os.Getenv("CHIME_NATS_TLS_CA"), os.Getenv("CHIME_NATS_TLS_CLIENT_CERT"), os.Getenv("CHIME_NATS_TLS_CLIENT_KEY"))...)
	nc, err := nats.Connect(natsURL(), append(opts, nats.Name("chime cli"), nats.Timeout(5*time.Second))...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", natsURL(), err)
	}
	return nc, nil
}

// request runs one request of agentID's client, bounded by requestTimeout,
// and prints its result as JSON.
func (a *App) request(ctx context.Context, agentID string, fn func(context.Context, *client.Client) (any, error)) error {
	return a.requestShown(ctx, agentID, nil, fn)
}

// requestShown is request, its reply shown as tables of columns when it
// lists records (nil columns: as JSON).
func (a *App) requestShown(ctx context.Context, agentID string, columns []string, fn func(context.Context, *client.Client) (any, error)) error {
	ctx, refuse := context.WithCancelCause(ctx)
	defer refuse(nil)
	// A request its token does not allow is refused by the server with a
	// permissions violation, and never answered: say so at once.
	c, closeConn, err := a.agentClient(agentID, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			refuse(err)
		}
	}))
	if err != nil {
		return err
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	res, err := fn(ctx, c)
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, nats.ErrPermissionViolation) {
		return fmt.Errorf("refused: %w", cause)
	}
	if err != nil {
		return err
	}
	if columns != nil {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		if shown, err := printTable(a.Stdout, b, columns); shown || err != nil {
			return err
		}
	}
	return a.printJSON(res)
}

// requestTimeout bounds a CLI request's round trip.
const requestTimeout = 10 * time.Second

// agentClient connects and returns a client for agentID; close ends the
// connection.
func (a *App) agentClient(agentID string, opts ...nats.Option) (c *client.Client, close func(), err error) {
	if err := subjects.ValidateID("agent_id", agentID); err != nil {
		return nil, nil, err
	}
	// connect adds the token, if any.
	nc, err := a.connect(append(client.ConnectOptions(agentID, ""), opts...)...)
	if err != nil {
		return nil, nil, err
	}
	if c, err = client.New(nc, agentID); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return c, nc.Close, nil
}

func (a *App) timer(ctx context.Context, args []string) error {
	sub := "create"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	fs := newFlagSet(a, "timer "+sub)
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	after := fs.Int64("after-ms", 0, "fire after N milliseconds (create)")
	every := fs.Int64("every-ms", 0, "then repeat every N milliseconds (create)")
	summary := fs.String("summary", "", "text of the fire (create)")
	requestID := fs.String("request-id", "", "repeatable create: a retry with the same ID returns the first timer (create)")
	limit := fs.Int("limit", 0, "at most N timers on the page (list; default 50, at most 1000)")
	cursor := fs.String("cursor", "", "the page after the one whose next_cursor this is (list)")
	allPages := fs.Bool("all", false, "every page: each timer once, as last read (list)")
	asJSON := fs.Bool("json", false, "print the JSON reply rather than a table (list)")
	cal := calendarFlags(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if err := flagsFor(fs, "timer", sub); err != nil {
		return err
	}
	var columns []string
	if sub == "list" && !*asJSON {
		columns = columnsOf(subjects.ActionTimerList)
	}
	return a.requestShown(ctx, *agent, columns, func(ctx context.Context, c *client.Client) (any, error) {
		switch sub {
		case "create":
			if body, ok := cal.body(fs, *summary, *requestID); ok {
				if *after != 0 || *every != 0 {
					return nil, fmt.Errorf("%w: timer create takes --cron or --after-ms, not both", ErrUsage)
				}
				var t timers.Timer
				return &t, c.Request(ctx, subjects.ActionTimerCreate, body, &t)
			}
			if *after <= 0 {
				return nil, fmt.Errorf("%w: timer create needs --after-ms N (a positive number of milliseconds)", ErrUsage)
			}
			var opts []client.TimerOption
			if *requestID != "" {
				opts = append(opts, client.WithRequestID(*requestID))
			}
			return c.CreateTimer(ctx, *after, *every, *summary, opts...)
		case "list":
			if *allPages {
				if *cursor != "" || *limit != 0 {
					return nil, fmt.Errorf("%w: timer list --all reads every page: no --cursor or --limit", ErrUsage)
				}
				list, err := c.AllTimers(ctx)
				if err != nil {
					return nil, err
				}
				return timers.ListTimersReply{Timers: list}, nil
			}
			return c.TimersPage(ctx, *limit, *cursor)
		case "get", "cancel":
			if len(pos) != 1 {
				return nil, fmt.Errorf("%w: timer %s needs one timer ID", ErrUsage, sub)
			}
			if sub == "get" {
				return c.GetTimer(ctx, pos[0])
			}
			return c.CancelTimer(ctx, pos[0])
		}
		return nil, fmt.Errorf("%w: unknown timer command %q", ErrUsage, sub)
	})
}

// flagsFor refuses a flag given to a subcommand it is not for: a flag's
// usage ends with the subcommands it serves in parentheses ("(create)",
// "(list, follow)", "(list; default 50)"), and one given elsewhere would
// be silently ignored.
func flagsFor(fs *flag.FlagSet, cmd, sub string) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if err != nil {
			return
		}
		subs, ok := flagSubcommands(f.Usage)
		if ok && !slices.Contains(subs, sub) {
			err = fmt.Errorf("%w: --%s is for %s %s, not %s %s", ErrUsage, f.Name, cmd, strings.Join(subs, " or "+cmd+" "), cmd, sub)
		}
	})
	return err
}

// flagSubcommands reads the subcommands a flag's usage names at its end.
func flagSubcommands(usage string) ([]string, bool) {
	if !strings.HasSuffix(usage, ")") {
		return nil, false
	}
	open := strings.LastIndex(usage, "(")
	if open < 0 {
		return nil, false
	}
	inner, _, _ := strings.Cut(usage[open+1:len(usage)-1], ";")
	var subs []string
	for _, w := range strings.Split(inner, ",") {
		w = strings.TrimSpace(w)
		if w == "" || strings.ContainsAny(w, " \t") {
			return nil, false // prose in parentheses, not a list of subcommands
		}
		subs = append(subs, w)
	}
	return subs, len(subs) > 0
}

// parseInterspersed parses flags that may come before or after positional
// arguments, as in "timer get ID --agent demo".
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// newFlagSet is the flag set of a command that speaks NATS: it takes the
// connect token as the nats CLI does.
func newFlagSet(a *App, name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(saying{a.Stderr, &a.flagsSaid})
	fs.StringVar(&a.token, "token", os.Getenv("CHIME_NATS_TOKEN"), "NATS connect token: an agent's or an operator's (default CHIME_NATS_TOKEN)")
	return fs
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
