package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/subjects"
)

// inbox prints the agent's deliveries after its cursor (or --after), one
// JSON line each ({seq, stored_at, envelope}), oldest first. --follow
// keeps printing them as they are stored and rides out chime restarts;
// --ack moves the agent's cursor past each line printed, so a follower
// that restarts resumes where it left off. `chime inbox watch` is the
// same read for a harness's monitor (watch).
func (a *App) inbox(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "watch" {
		return a.watch(ctx, args[1:])
	}
	fs := newFlagSet(a, "inbox")
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	follow := fs.Bool("follow", false, "keep printing deliveries as they are stored, until interrupted")
	ack := fs.Bool("ack", false, "move the agent's cursor past each delivery printed")
	after := fs.Uint64("after", 0, "start after this sequence rather than at the agent's cursor")
	max := fs.Int("max", 100, fmt.Sprintf("at most N deliveries a request (1-%d)", deliveries.MaxInboxFetch))
	if help, err := parseFlagsOnly(fs, args, "inbox"); help || err != nil {
		return err
	}
	return a.readInbox(ctx, *agent, inboxRead{follow: *follow, ack: *ack, after: *after, max: *max, line: jsonLine})
}

// watch runs `chime inbox watch`: the agent's deliveries from its cursor
// on, one line each as they are stored, for a harness's monitor (Claude
// Code's Monitor wakes its session with each line). Each line is acked as
// soon as it is written, before the next is printed, so a watcher killed
// and started again resumes after the last line it acked: nothing is lost,
// and at most the one line written but not yet acked is printed again. It
// runs until SIGINT or SIGTERM, which let an ack under way finish.
func (a *App) watch(ctx context.Context, args []string) error {
	fs := newFlagSet(a, "inbox watch")
	fs.Usage = func() {
		fmt.Fprint(a.Stderr, `Usage: chime inbox watch [--agent ID] [--token T] [--json]

Prints the agent's deliveries from its cursor on, one line each, as they are
stored, and acks each line once it is written: a watcher started again resumes
after the last line it acked. A line is: SEQ KIND ENVELOPE_ID TRUST: "TEXT"
(or the data as JSON when there is no text); --json prints {seq, stored_at,
envelope}. It rides out chime and NATS restarts; SIGINT or SIGTERM end it.

`)
		fs.PrintDefaults()
	}
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	asJSON := fs.Bool("json", false, "print each delivery as JSON, {seq, stored_at, envelope}, not as text")
	if help, err := parseFlagsOnly(fs, args, "inbox watch"); help || err != nil {
		return err
	}
	line := textLine
	if *asJSON {
		line = jsonLine
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return a.readInbox(ctx, *agent, inboxRead{follow: true, ack: true, max: deliveries.DefaultInboxFetch, line: line})
}

// parseFlagsOnly parses the flags of command, which takes no other
// argument; help is true when --help was asked for (and shown).
func parseFlagsOnly(fs *flag.FlagSet, args []string, command string) (help bool, err error) {
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if len(pos) > 0 {
		return false, fmt.Errorf("%w: %s: unexpected %q (see chime %s --help)", ErrUsage, command, pos[0], command)
	}
	return false, nil
}

// inboxRead is how readInbox reads and prints.
type inboxRead struct {
	follow, ack bool
	after       uint64 // 0: from the agent's cursor
	max         int
	line        func(deliveries.InboxDelivery) ([]byte, error)
}

func jsonLine(d deliveries.InboxDelivery) ([]byte, error) { return json.Marshal(d) }

func textLine(d deliveries.InboxDelivery) ([]byte, error) { return deliveries.Line(d), nil }

// retry paces a follower's retries while chime or NATS is away: soon at
// first, then every few seconds.
var retry = backoff.Policy{Min: 100 * time.Millisecond, Max: 5 * time.Second}

// readInbox prints the agent's deliveries, a line each, through the
// agent's reliable read (inbox.fetch): one batch, or with follow every
// batch as it is stored, waiting out chime's and NATS's absence. With ack
// each line is acked once written, before the next: a reader started
// again after a kill prints at most that one line again.
func (a *App) readInbox(ctx context.Context, agentID string, r inboxRead) error {
	// A request its token does not allow is refused by the server with a
	// permissions violation and never answered, and a follower's
	// connection whose token names no one keeps failing to reconnect: it
	// would take either for chime's absence and wait for ever. Either ends
	// the read, and ctx. Once a read has worked, though, an authorization
	// error is chime's auth callout being away with its chime (restarting
	// with the embedded server): waited out, as the outage it is.
	var refusal atomic.Pointer[error]
	var worked atomic.Bool
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	refuse := func(err error) {
		refusal.CompareAndSwap(nil, &err)
		stop()
	}
	refused := func() error {
		if p := refusal.Load(); p != nil {
			return *p
		}
		return nil
	}
	authError := func(err error) {
		if !worked.Load() && (errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
			errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)) {
			refuse(fmt.Errorf("refused: %w", err))
		}
	}
	opts := []nats.Option{
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				refuse(fmt.Errorf("refused: %w", err))
			}
			authError(err)
		}),
		// A connect retried (RetryOnFailedConnect) or a reconnect reports
		// its failures here, not to the error handler.
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { authError(err) }),
	}
	if r.follow {
		// A follower outlives restarts of its NATS server (the embedded
		// one restarts with its chime) however long they take, may start
		// before it, and does not give up on authorization errors (above).
		opts = append(opts, nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.IgnoreAuthErrorAbort())
	}
	c, closeConn, err := a.agentClient(agentID, opts...)
	if err != nil {
		return err
	}
	defer closeConn()
	from := r.after
	down := 0 // failed reads in a row; said once, and again once chime answers
	for {
		got, err := fetchInbox(ctx, c, from, r.max, r.follow)
		if err := refused(); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil // interrupted while following
		}
		if err != nil {
			if !r.follow || !passing(err) {
				return err
			}
			if down == 0 {
				fmt.Fprintf(a.Stderr, "chime inbox: %v; still following\n", err)
			}
			if !retry.Sleep(ctx, down) {
				return refused() // nil: interrupted
			}
			down++
			continue
		}
		worked.Store(true)
		if down > 0 {
			fmt.Fprintln(a.Stderr, "chime inbox: following again")
			down = 0
		}
		for _, d := range got.Deliveries {
			if ctx.Err() != nil {
				return refused() // interrupted: the rest of the batch comes at the next start
			}
			if err := a.printDelivery(r.line, d); err != nil {
				return err
			}
			from = d.Seq
			if r.ack {
				if err := a.ackPrinted(ctx, c, d.Seq, r.follow, refused); err != nil {
					return err
				}
			}
		}
		if !r.follow {
			return nil
		}
		if from == 0 {
			from = got.Acked
		}
	}
}

// fetchInbox is one inbox.fetch after from (0: after the cursor); a
// follower's waits for the next delivery.
func fetchInbox(ctx context.Context, c *client.Client, from uint64, max int, follow bool) (*deliveries.InboxFetchReply, error) {
	req := map[string]any{"max": max}
	if from > 0 {
		req["after"] = from
	}
	if follow {
		req["wait_ms"] = deliveries.MaxInboxWait.Milliseconds()
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var got deliveries.InboxFetchReply
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	return &got, c.Request(rctx, deliveries.ActionInboxFetch, body, &got)
}

// printDelivery writes d's line and its newline in one write, so a reader of
// a pipe gets it whole and at once (os.Stdout is unbuffered; a writer
// that buffers is flushed).
func (a *App) printDelivery(line func(deliveries.InboxDelivery) ([]byte, error), d deliveries.InboxDelivery) error {
	b, err := line(d)
	if err != nil {
		return err
	}
	if _, err := a.Stdout.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("print delivery %d: %w", d.Seq, err)
	}
	if f, ok := a.Stdout.(interface{ Flush() error }); ok {
		if err := f.Flush(); err != nil {
			return fmt.Errorf("print delivery %d: %w", d.Seq, err)
		}
	}
	return nil
}

// ackPrinted acks seq, a line just printed. A follower retries while
// chime is away and prints nothing more meanwhile: whatever happens next,
// only this line can be printed again. Each attempt runs to its own end
// even when ctx ends (an interrupt), so that an interrupt right after a
// line does not print it again at the next start; ctx ends the retries,
// and so does a refusal (refused: the token does not allow the ack).
func (a *App) ackPrinted(ctx context.Context, c *client.Client, seq uint64, follow bool, refused func() error) error {
	for n := 0; ; n++ {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		_, err := c.AckInbox(actx, seq)
		cancel()
		switch {
		case err == nil:
			return nil
		case refused() != nil:
			return refused()
		case !follow || !passing(err):
			return fmt.Errorf("inbox ack %d: %w", seq, err)
		case n == 0:
			fmt.Fprintf(a.Stderr, "chime inbox: ack %d: %v; retrying\n", seq, err)
		}
		if !retry.Sleep(ctx, n) {
			return refused() // nil: interrupted
		}
	}
}

// passing reports whether err is one a follower waits out: chime away
// (restarting, no replica) or its storage electing a leader.
func passing(err error) bool {
	return errors.Is(err, &subjects.Error{Code: subjects.CodeUnavailable}) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrConnectionReconnecting)
}
