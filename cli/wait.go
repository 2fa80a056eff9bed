package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

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
	minutes := fs.Float64("minutes", 0, "wait N minutes (a fraction is taken to the second: 0.5 is 30 s)")
	until := fs.String("until", "", "wait until a time (ISO 8601, or YYYY-MM-DD[ HH:MM[:SS]])")
	tz := fs.String("tz", "", "IANA zone a naive --until is read in")
	if _, err := parseInterspersed(fs, args); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	req, err := waitLength(fs, *seconds, *minutes, *until, *tz)
	if err != nil {
		return err
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
	// A bar redraws its line: on a terminal only. Elsewhere (a log, a
	// pipe) the start and the end are the lines.
	live := isTerminal(a.Stderr)
	req.Started = func(r waits.WaitReply) {
		waitID = r.WaitID
		fmt.Fprintf(a.Stderr, "wait %s until %s\n", r.WaitID, r.TargetTime)
		if !live {
			return
		}
		target, _ := waits.ParseUntil(r.TargetTime, time.UTC)
		total := max(time.Until(target).Milliseconds(), 1)
		bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(a.Stderr),
			progressbar.OptionSetDescription(plainHeading(waits.WaitHeading(waits.RemainingText(float64(total)/1000)))),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionSetPredictTime(false),
		)
	}
	req.Progress = func(p waits.WaitProgress) {
		if bar == nil {
			return
		}
		bar.Describe(plainHeading(p.Heading))
		_ = bar.Set64(max(bar.GetMax64()-int64(p.RemainingSeconds*1000), 0))
	}
	res, err := c.Wait(ctx, req)
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

// waitLength is the wait's length from its flags: exactly one of them,
// fractional minutes taken to the second.
func waitLength(fs *flag.FlagSet, seconds int64, minutes float64, until, tz string) (client.WaitRequest, error) {
	var given []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "seconds" || f.Name == "minutes" || f.Name == "until" {
			given = append(given, "--"+f.Name)
		}
	})
	switch {
	case len(given) == 0:
		return client.WaitRequest{}, fmt.Errorf("%w: wait needs --seconds N, --minutes N or --until T", ErrUsage)
	case len(given) > 1:
		return client.WaitRequest{}, fmt.Errorf("%w: wait takes one of --seconds, --minutes and --until, not %s", ErrUsage, strings.Join(given, " and "))
	case tz != "" && until == "":
		return client.WaitRequest{}, fmt.Errorf("%w: --tz is for --until", ErrUsage)
	}
	r := client.WaitRequest{Seconds: seconds, Until: until, TZ: tz}
	if minutes != 0 {
		switch whole := int64(minutes); {
		case minutes < 0 || math.IsNaN(minutes) || math.IsInf(minutes, 0):
			return r, fmt.Errorf("%w: --minutes must be positive, not %v", ErrUsage, minutes)
		case float64(whole) == minutes:
			r.Minutes = whole
		default:
			r.Seconds = int64(math.Round(minutes * 60))
			if r.Seconds < 1 {
				return r, fmt.Errorf("%w: --minutes %v is less than a second", ErrUsage, minutes)
			}
		}
	}
	return r, nil
}

// plainHeading is a progress heading without the icon reference the
// contract's text carries for a console ("icon://timer Wait: 2m 10s").
func plainHeading(h string) string {
	if rest, ok := strings.CutPrefix(h, "icon://"); ok {
		if _, after, ok := strings.Cut(rest, " "); ok {
			return after
		}
	}
	return h
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
