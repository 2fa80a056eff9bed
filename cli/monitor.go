package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// monitorUsage is `chime monitor run`'s synopsis.
const monitorUsage = "chime monitor run [--agent ID] [--id MON] [--description D] [--match RE] [--exclude RE] [--timeout-ms N | --persistent] [--max-events N] [--idle-timeout-ms N] -- CMD [ARGS]"

// monitorPoll is how often `chime monitor run` asks whether its monitor
// was stopped elsewhere (monitor.stop, the console) while its command is
// quiet; a batch's reply tells it at once otherwise.
const monitorPoll = 2 * time.Second

// maxReadLine bounds the bytes of one line read from the command; the
// rest of a longer line is counted and dropped here (chime cuts lines at
// monitors.MaxLineBytes anyway).
const maxReadLine = 64 << 10

// monitor runs `chime monitor run`: the command source's executor.
func (a *App) monitor(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "run" {
		return fmt.Errorf("%w: %s", ErrUsage, monitorUsage)
	}
	fs := newFlagSet(a, "monitor run")
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	id := fs.String("id", "", "monitor ID (default: chime picks mon_...)")
	desc := fs.String("description", "", "what the monitor watches, named in every event (default: the command line)")
	match := fs.String("match", "", "deliver only the lines this regular expression (RE2) matches")
	exclude := fs.String("exclude", "", "drop the lines this regular expression (RE2) matches")
	timeout := fs.Int64("timeout-ms", 0, "stop after this many milliseconds (default 300000, at most 3600000)")
	persistent := fs.Bool("persistent", false, "run until stopped, with no timeout")
	maxEvents := fs.Int64("max-events", 0, "stop once this many lines are delivered")
	idle := fs.Int64("idle-timeout-ms", 0, "stop when no line is delivered for this many milliseconds")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return fmt.Errorf("%w: monitor run needs a command after --", ErrUsage)
	}
	line := commandLine(argv)
	req := monitors.StartRequest{MonitorID: *id, Description: *desc, Command: line, Match: *match, Exclude: *exclude, Persistent: *persistent}
	if req.Description == "" {
		req.Description = cutRunes(line, monitors.MaxDescriptionLen)
	}
	for _, f := range []struct {
		v   int64
		raw *json.RawMessage
	}{{*timeout, &req.TimeoutMS}, {*maxEvents, &req.MaxEvents}, {*idle, &req.IdleTimeoutMS}} {
		if f.v != 0 {
			*f.raw = json.RawMessage(fmt.Sprint(f.v))
		}
	}
	c, closeConn, err := a.agentClient(*agent)
	if err != nil {
		return err
	}
	defer closeConn()
	// Signals are ours from here on: forwarded to the command, never
	// ending this process before the monitor is stopped.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("monitor start: %w", err)
	}
	var m monitors.Monitor
	sctx, cancel := context.WithTimeout(ctx, requestTimeout)
	err = c.Request(sctx, monitors.ActionStart, body, &m)
	cancel()
	if err != nil {
		return fmt.Errorf("monitor start: %w", err)
	}
	if err := a.printLine(map[string]string{"monitor_id": m.ID}); err != nil {
		return err
	}
	run := &monitorRun{c: c, id: m.ID, stopped: make(chan string, 1), log: a.Stderr}
	exit, interrupted := run.run(ctx, argv, sigs)
	stop := monitors.StopRequest{MonitorID: m.ID}
	if !interrupted && exit != nil {
		stop.ExitCode = exit
	}
	final, err := stopMonitor(ctx, c, stop)
	if err != nil {
		return fmt.Errorf("monitor stop: %w", err)
	}
	return a.printLine(final)
}

// commandLine is argv as one line, each argument quoted when it needs to
// be read back apart.
func commandLine(argv []string) string {
	parts := make([]string, len(argv))
	for i, s := range argv {
		if s == "" || strings.ContainsAny(s, " \t\"'\\$`|&;<>()*?[]{}#~") {
			b, _ := json.Marshal(s)
			s = string(b)
		}
		parts[i] = strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(s)
	}
	return cutBytes(strings.Join(parts, " "), monitors.MaxCommandLen)
}

func cutRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}

func cutBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// monitorRun is one command run as a monitor's source.
type monitorRun struct {
	c   *client.Client
	id  string
	log io.Writer
	// stopped carries the reason chime stopped the monitor for (a batch's
	// reply, a poll), once.
	stopped chan string
	once    sync.Once
}

func (r *monitorRun) stoppedBy(reason string) {
	r.once.Do(func() { r.stopped <- reason })
}

// run runs argv, sending its stdout lines to the monitor, until the
// command ends: its exit code (128+signal when a signal ended it), and
// whether this process was interrupted. A stop of the monitor from
// elsewhere stops the command (SIGTERM, then SIGKILL).
func (r *monitorRun) run(ctx context.Context, argv []string, sigs <-chan os.Signal) (*int, bool) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = r.log
	inGroup(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		code := 127
		fmt.Fprintf(r.log, "chime monitor run: %v\n", err)
		return &code, false
	}
	if err := cmd.Start(); err != nil {
		code := 127 // as a shell reports a command it cannot run
		fmt.Fprintf(r.log, "chime monitor run: %v\n", err)
		return &code, false
	}
	sendCtx, stopSending := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSending()
	lines := make(chan string, monitors.MaxBatchLines)
	sent := make(chan error, 1)
	go func() {
		err := monitors.Gather(sendCtx, lines, r.emitter())
		for range lines { // stopped: the rest is not sent, but read
		}
		sent <- err
	}()
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(lines)
		readLines(out, func(l string) { lines <- monitors.CapLine(l) })
	}()
	done := make(chan error, 1)
	go func() {
		<-read // Wait closes the pipe: read it all first
		done <- cmd.Wait()
	}()
	pctx, stopPolling := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		r.poll(pctx)
	}()
	defer func() {
		stopPolling()
		<-polled
	}()
	interrupted, _, werr := supervision{sigs: sigs, stop: r.stopped, grace: killGrace, stopping: func(reason string) {
		fmt.Fprintf(r.log, "chime monitor run: monitor %s stopped (%s): stopping the command\n", r.id, reason)
	}}.wait(cmd, done)
	if err := <-sent; err != nil && !errors.Is(err, errMonitorStopped) {
		fmt.Fprintf(r.log, "chime monitor run: lines not sent: %v\n", err)
	}
	return exitCode(cmd, werr), interrupted
}

// readLines calls emit with each line of r, a line longer than
// maxReadLine cut there.
func readLines(r io.Reader, emit func(string)) {
	br := bufio.NewReaderSize(r, maxReadLine)
	for {
		b, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			emit(string(b))
			for errors.Is(err, bufio.ErrBufferFull) { // the rest of the line
				_, err = br.ReadSlice('\n')
			}
		} else if len(b) > 0 {
			emit(string(b))
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// errMonitorStopped ends the sending once chime has stopped the monitor.
var errMonitorStopped = errors.New("monitor stopped")

// emitter sends each batch as monitor.emit, seq 0, 1, 2..., retrying while
// chime is unavailable (the seq makes a retry harmless). A reply that says
// the monitor stopped stops the command.
func (r *monitorRun) emitter() func(ctx context.Context, lines []string) error {
	var seq int64
	return func(ctx context.Context, lines []string) error {
		body, err := json.Marshal(monitors.EmitRequest{MonitorID: r.id, Seq: &seq, Lines: lines})
		if err != nil {
			return err
		}
		for n := 0; ; n++ {
			var reply monitors.EmitReply
			rctx, cancel := context.WithTimeout(ctx, requestTimeout)
			err = r.c.Request(rctx, monitors.ActionEmit, body, &reply)
			cancel()
			var wire *subjects.Error
			switch {
			case err == nil:
				seq = reply.NextSeq
				if reply.Status == monitors.Stopped {
					r.stoppedBy(reply.StopReason)
					return errMonitorStopped
				}
				if reply.Superseded { // the seq held other lines: these go again
					if body, err = json.Marshal(monitors.EmitRequest{MonitorID: r.id, Seq: &seq, Lines: lines}); err != nil {
						return err
					}
					continue
				}
				return nil
			case errors.As(err, &wire) && wire.Code == monitors.CodeMonitorStopped:
				r.stoppedBy(wire.Message)
				return errMonitorStopped
			case errors.As(err, &wire) && wire.Code != subjects.CodeUnavailable:
				return err
			}
			if !backoff.Sleep(ctx, min(time.Duration(n+1)*500*time.Millisecond, 5*time.Second)) {
				return err
			}
		}
	}
}

// poll asks every monitorPoll, until ctx ends, whether the monitor was
// stopped elsewhere.
func (r *monitorRun) poll(ctx context.Context) {
	body, _ := json.Marshal(monitors.Ref{MonitorID: r.id})
	reason, ok := pollStopped(ctx, monitorPoll, func(ctx context.Context) (string, bool) {
		var m monitors.Monitor
		err := r.c.Request(ctx, monitors.ActionGet, body, &m)
		return m.StopReason, err == nil && m.Finished()
	})
	if ok {
		r.stoppedBy(reason)
	}
}

// stopMonitor stops the monitor, retrying while chime is unavailable; a
// stop of a stopped monitor answers its record.
func stopMonitor(ctx context.Context, c *client.Client, req monitors.StopRequest) (*monitors.Monitor, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	for {
		var m monitors.Monitor
		rctx, rcancel := context.WithTimeout(ctx, requestTimeout)
		err := c.Request(rctx, monitors.ActionStop, body, &m)
		rcancel()
		var wire *subjects.Error
		if err == nil {
			return &m, nil
		}
		if errors.As(err, &wire) && wire.Code != subjects.CodeUnavailable {
			return nil, err
		}
		if !backoff.Sleep(ctx, time.Second) {
			return nil, err
		}
	}
}
