package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
)

// task runs `chime task run`: the built-in executor.
func (a *App) task(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "run" {
		return fmt.Errorf("%w: chime task run [--agent ID] [--id TASK] [--title T] [--grace D] [--tee] -- CMD [ARGS]", ErrUsage)
	}
	fs := newFlagSet(a, "task run")
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	id := fs.String("id", "", "task ID (default: chime picks task_...)")
	title := fs.String("title", "", "task title")
	grace := fs.Duration("grace", killGrace, "after a cancel, how long the command has to end after SIGTERM before SIGKILL")
	tee := fs.Bool("tee", false, "also copy the command's output to this process's stderr (stdout carries the task's JSON lines)")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	argv := fs.Args()
	switch {
	case len(argv) == 0:
		return fmt.Errorf("%w: task run needs a command after --", ErrUsage)
	case *grace <= 0:
		return fmt.Errorf("%w: --grace must be positive, not %v", ErrUsage, *grace)
	}
	c, closeConn, err := a.agentClient(*agent)
	if err != nil {
		return err
	}
	defer closeConn()
	// Signals are ours from here on: forwarded to the command, never
	// ending this process before the result is reported.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	sctx, cancel := context.WithTimeout(ctx, requestTimeout)
	t, err := c.StartTask(sctx, *id, *title)
	cancel()
	if err != nil {
		return fmt.Errorf("task start: %w", err)
	}
	if t.Finished() {
		// A start of a finished task's ID answers its record: running the
		// command again would repeat its side effects for nothing.
		return fmt.Errorf("task %s has already ended (%s): the command was not run", t.ID, t.Status)
	}
	if err := a.printLine(map[string]string{"task_id": t.ID}); err != nil {
		return err
	}
	up := newUploader(ctx, c, t.ID)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = up, up
	if *tee {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(up, a.Stderr), io.MultiWriter(up, a.Stderr)
	}
	inGroup(cmd)
	res := tasks.TaskResultRequest{TaskID: t.ID, OutputAppended: true}
	var exit *int
	if err := cmd.Start(); err != nil {
		code := 127 // as a shell reports a command it cannot run
		res.Status, res.ExitCode, res.Error, exit = tasks.TaskFailed, &code, err.Error(), &code
	} else {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		wctx, stopWatching := context.WithCancel(ctx)
		cancelled := make(chan string, 1)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			watchCancel(wctx, c, t.ID, cancelled)
		}()
		interrupted, stopped, werr := supervision{sigs: sigs, stop: cancelled, grace: *grace, stopping: func(string) {
			fmt.Fprintf(a.Stderr, "chime task run: task %s was cancelled: stopping the command\n", t.ID)
		}}.wait(cmd, done)
		stopWatching()
		<-watched
		exit = exitCode(cmd, werr)
		res.Status, res.ExitCode, res.Error = outcome(cmd, werr, interrupted)
		if stopped != "" {
			res.Status, res.ExitCode, res.Error = tasks.TaskCancelled, exit, joinText("stopped: the task was cancelled", res.Error)
		}
	}
	if err := up.close(); err != nil {
		// The output could not be stored: report the result without it
		// rather than none at all.
		res.OutputAppended, res.Error = false, joinText(res.Error, "output not stored: "+err.Error())
	}
	final, err := reportResult(ctx, c, res)
	if errors.Is(err, tasks.ErrTaskHasResult) && res.Status != tasks.TaskCancelled {
		// Cancelled as the command ended on its own: what it left is
		// attached to the cancel.
		res.Status = tasks.TaskCancelled
		final, err = reportResult(ctx, c, res)
	}
	if err != nil {
		return fmt.Errorf("task result: %w", err)
	}
	if err := a.printLine(final); err != nil {
		return err
	}
	if *exit != 0 {
		return &ExitError{Code: *exit}
	}
	return nil
}

// cancelPoll is how often a running task's record is read for a cancel:
// the command is stopped within about this much of one.
const cancelPoll = 500 * time.Millisecond

// watchCancel reads the task's record every cancelPoll until ctx ends and
// says "cancelled" on stop once chime has cancelled the task.
func watchCancel(ctx context.Context, c *client.Client, taskID string, stop chan<- string) {
	if reason, ok := pollStopped(ctx, cancelPoll, func(ctx context.Context) (string, bool) {
		task, err := c.GetTask(ctx, taskID)
		return "cancelled", err == nil && task.Status == tasks.TaskCancelled
	}); ok {
		stop <- reason
	}
}

// printLine prints v as one line of JSON: a caller reads the task ID as
// soon as the first line comes, the record from the last.
func (a *App) printLine(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	_, err = fmt.Fprintf(a.Stdout, "%s\n", b)
	return err
}

// outcome maps how the command ended to the task's status.
func outcome(cmd *exec.Cmd, err error, interrupted bool) (tasks.TaskStatus, *int, string) {
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case interrupted || ws.Signaled():
		msg := "interrupted"
		if ws.Signaled() {
			msg = "killed by signal " + ws.Signal().String()
		}
		return tasks.TaskInterrupted, nil, msg
	case err == nil:
		code := 0
		return tasks.TaskCompleted, &code, ""
	}
	code := cmd.ProcessState.ExitCode()
	return tasks.TaskFailed, &code, fmt.Sprintf("exit code %d", code)
}

func joinText(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// reportResult reports res, retrying while chime is unavailable: an
// identical retry is answered with the stored result.
func reportResult(ctx context.Context, c *client.Client, res tasks.TaskResultRequest) (*tasks.Task, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, requestTimeout)
		t, err := c.ReportResult(rctx, res)
		rcancel()
		var wire *subjects.Error
		if err == nil || (errors.As(err, &wire) && wire.Code != subjects.CodeUnavailable) {
			return t, err
		}
		if !backoff.Sleep(ctx, time.Second) {
			return nil, err
		}
	}
}

// uploader streams a command's output to task.output.append in chunks
// of up to subjects.MaxAppendChunk, from a goroutine, so a slow chime
// never blocks the command: output waits in memory meanwhile.
type uploader struct {
	ctx    context.Context
	c      *client.Client
	taskID string
	mu     sync.Mutex
	buf    []byte
	closed bool
	kick   chan struct{}
	done   chan error
}

// flushEvery is how long output may wait before it is sent.
const flushEvery = 500 * time.Millisecond

func newUploader(ctx context.Context, c *client.Client, taskID string) *uploader {
	u := &uploader{ctx: ctx, c: c, taskID: taskID, kick: make(chan struct{}, 1), done: make(chan error, 1)}
	go func() { u.done <- u.run() }()
	return u
}

func (u *uploader) Write(p []byte) (int, error) {
	u.mu.Lock()
	u.buf = append(u.buf, p...)
	full := len(u.buf) >= tasks.MaxAppendChunk
	u.mu.Unlock()
	if full {
		select {
		case u.kick <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// close sends what is left and returns the first error.
func (u *uploader) close() error {
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	select {
	case u.kick <- struct{}{}:
	default:
	}
	return <-u.done
}

func (u *uploader) run() error {
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	var seq int64
	for {
		select {
		case <-tick.C:
		case <-u.kick:
		}
		for {
			u.mu.Lock()
			n := min(len(u.buf), tasks.MaxAppendChunk)
			chunk, closed := u.buf[:n:n], u.closed
			u.mu.Unlock()
			if n == 0 {
				if closed {
					return nil
				}
				break
			}
			if err := u.send(seq, chunk); err != nil {
				return err
			}
			seq++
			u.mu.Lock()
			u.buf = u.buf[n:]
			u.mu.Unlock()
			if n < tasks.MaxAppendChunk && !closed {
				break // a partial chunk: wait for more
			}
		}
	}
}

// send appends one chunk, retrying while chime is unavailable; the seq
// makes a retry of a stored chunk harmless.
func (u *uploader) send(seq int64, chunk []byte) error {
	var err error
	for range 10 {
		ctx, cancel := context.WithTimeout(u.ctx, requestTimeout)
		_, err = u.c.AppendOutput(ctx, u.taskID, seq, chunk)
		cancel()
		var wire *subjects.Error
		if err == nil || (errors.As(err, &wire) && wire.Code != subjects.CodeUnavailable) {
			return err
		}
		time.Sleep(time.Second)
	}
	return err
}
