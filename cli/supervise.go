package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// ExitError ends chime with Code once the command has said what it had
// to say: `chime task run` exits with its command's status.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// killGrace is how long a command has to end after SIGTERM before SIGKILL.
const killGrace = 5 * time.Second

// supervision is how a command run on an agent's behalf is stopped: the
// signals this process gets are forwarded to the command's process group,
// and a stop (chime cancelled its task, stopped its monitor) sends the
// group SIGTERM, then SIGKILL after grace. The command runs in its own
// group (Setpgid), so a stop reaches what it started too (a shell's
// children), not only the shell.
type supervision struct {
	sigs  <-chan os.Signal
	stop  <-chan string
	grace time.Duration
	// stopping is told the reason a stop came for, once.
	stopping func(reason string)
}

// inGroup makes cmd start in a process group of its own.
func inGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// wait waits for the end of cmd, started, whose Wait reports on done, and
// stops it as the supervision says. It returns whether a signal to this
// process interrupted the command, the reason of a stop ("" when none
// came), and Wait's error.
func (s supervision) wait(cmd *exec.Cmd, done <-chan error) (interrupted bool, stopped string, werr error) {
	group := func(sig syscall.Signal) { _ = syscall.Kill(-cmd.Process.Pid, sig) }
	stop := s.stop
	var kill <-chan time.Time
	for {
		select {
		case sig := <-s.sigs:
			interrupted = true
			if n, ok := sig.(syscall.Signal); ok {
				group(n)
			}
		case reason := <-stop:
			stop, stopped = nil, reason
			if s.stopping != nil {
				s.stopping(reason)
			}
			group(syscall.SIGTERM)
			kill = time.After(s.grace)
		case <-kill:
			group(syscall.SIGKILL)
		case werr = <-done:
			return interrupted, stopped, werr
		}
	}
}

// exitCode is how the command ended, as a shell reports it: its exit
// code, or 128+n for a signal n.
func exitCode(cmd *exec.Cmd, err error) *int {
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code := 128 + int(ws.Signal())
		return &code
	}
	code := 0
	if err != nil {
		code = cmd.ProcessState.ExitCode()
	}
	return &code
}

// pollStopped asks stopped every interval, until ctx ends, whether chime
// has ended what the command runs for (its task cancelled, its monitor
// stopped); once it has, it returns why. A failed ask is asked again.
func pollStopped(ctx context.Context, every time.Duration, stopped func(ctx context.Context) (reason string, ok bool)) (string, bool) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return "", false
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		reason, ok := stopped(rctx)
		cancel()
		if ok {
			return reason, true
		}
	}
}
