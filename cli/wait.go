package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/waits"
)

// ErrInterrupted marks a command the user stopped with Ctrl-C.
var ErrInterrupted = errors.New("interrupted")

// wait runs `chime wait`: a managed wait with a live progress bar fed by
// the server's progress events. Ctrl-C cancels the wait on the server.
func (a *App) wait(ctx context.Context, args []string) error {
	fs := newFlagSet(a, "wait")
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	seconds := fs.Int64("seconds", 0, "wait N seconds")
	minutes := fs.Int64("minutes", 0, "wait N minutes")
	until := fs.String("until", "", "wait until a time (ISO 8601, or YYYY-MM-DD[ HH:MM[:SS]])")
	tz := fs.String("tz", "", "IANA zone a naive --until is read in")
	if _, err := parseInterspersed(fs, args); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if *seconds == 0 && *minutes == 0 && *until == "" {
		return fmt.Errorf("%w: wait needs --seconds N, --minutes N or --until T", ErrUsage)
	}
	c, closeConn, err := a.agentClient(*agent)
	if err != nil {
		return err
	}
	defer closeConn()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	var bar *progressbar.ProgressBar
	var waitID string
	res, err := c.Wait(ctx, client.WaitRequest{
		Seconds: *seconds, Minutes: *minutes, Until: *until, TZ: *tz,
		Started: func(r waits.WaitReply) {
			waitID = r.WaitID
			target, _ := waits.ParseUntil(r.TargetTime, time.UTC)
			total := max(time.Until(target).Milliseconds(), 1)
			bar = progressbar.NewOptions64(total,
				progressbar.OptionSetWriter(a.Stderr),
				progressbar.OptionSetDescription(waits.WaitHeading(waits.RemainingText(float64(total)/1000))),
				progressbar.OptionSetWidth(30),
				progressbar.OptionShowElapsedTimeOnFinish(),
				progressbar.OptionSetPredictTime(false),
			)
			fmt.Fprintf(a.Stderr, "wait %s until %s\n", r.WaitID, r.TargetTime)
		},
		Progress: func(p waits.WaitProgress) {
			if bar == nil {
				return
			}
			bar.Describe(p.Heading)
			_ = bar.Set64(max(bar.GetMax64()-int64(p.RemainingSeconds*1000), 0))
		},
	})
	if bar != nil {
		if err == nil {
			_ = bar.Finish()
		}
		fmt.Fprintln(a.Stderr)
	}
	if errors.Is(err, context.Canceled) && waitID != "" {
		// Ctrl-C: the wait must not outlive the terminal that asked for it.
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, cerr := c.CancelWait(cctx, waitID); cerr != nil {
			return fmt.Errorf("wait %s: interrupted, and the cancel failed: %w", waitID, cerr)
		}
		fmt.Fprintf(a.Stderr, "wait %s cancelled\n", waitID)
		return ErrInterrupted
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(a.Stdout, res.Text)
	return nil
}
