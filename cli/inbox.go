package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/subjects"
)

// inbox prints the agent's deliveries after its cursor (or --after), one
// JSON line each ({seq, stored_at, envelope}), oldest first. --follow
// keeps printing them as they are stored, a line per delivery as a
// harness's monitor reads them, and rides out chime restarts; --ack moves
// the agent's cursor past each line printed, so a follower that restarts
// resumes where it left off.
func (a *App) inbox(ctx context.Context, args []string) error {
	fs := newFlagSet(a, "inbox")
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	follow := fs.Bool("follow", false, "keep printing deliveries as they are stored, until interrupted")
	ack := fs.Bool("ack", false, "move the agent's cursor past each delivery printed")
	after := fs.Uint64("after", 0, "start after this sequence rather than at the agent's cursor")
	max := fs.Int("max", 100, "at most N deliveries a request (1-1000)")
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: inbox: unexpected %q (see chime inbox --help)", ErrUsage, pos[0])
	}
	c, closeConn, err := a.agentClient(*agent)
	if err != nil {
		return err
	}
	defer closeConn()
	out := json.NewEncoder(a.Stdout)
	from := *after
	var acked uint64 // the cursor as this follower last moved it
	down := false    // said that chime does not answer; said again once it does
	for {
		req := map[string]any{"max": *max}
		if from > 0 {
			req["after"] = from
		}
		if *follow {
			req["wait_ms"] = deliveries.MaxInboxWait.Milliseconds()
		}
		body, err := json.Marshal(req)
		if err != nil {
			return err
		}
		var got deliveries.InboxFetchReply
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		err = c.Request(rctx, deliveries.ActionInboxFetch, body, &got)
		cancel()
		if ctx.Err() != nil {
			return nil // interrupted while following
		}
		if err != nil {
			if !*follow || !passing(err) {
				return err
			}
			if !down {
				fmt.Fprintf(a.Stderr, "chime inbox: %v; still following\n", err)
				down = true
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
			continue
		}
		down = false
		for _, d := range got.Deliveries {
			if err := out.Encode(d); err != nil {
				return err
			}
			from = d.Seq
		}
		if *ack && from > acked {
			// Acks are cumulative: one that chime's absence failed is
			// made good by the next, after the next fetch.
			actx, cancel := context.WithTimeout(ctx, requestTimeout)
			_, err := c.AckInbox(actx, from)
			cancel()
			switch {
			case ctx.Err() != nil:
				return nil
			case err == nil:
				acked = from
			case !*follow || !passing(err):
				return fmt.Errorf("inbox ack %d: %w", from, err)
			}
		}
		if !*follow {
			return nil
		}
		if from == 0 {
			from = got.Acked
		}
	}
}

// passing reports whether err is one a follower waits out: chime away
// (restarting, no replica) or its storage electing a leader.
func passing(err error) bool {
	return errors.Is(err, &subjects.Error{Code: subjects.CodeUnavailable}) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrConnectionReconnecting)
}
