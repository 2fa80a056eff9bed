package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
)

// taskResults decodes the task_result envelopes in the inbox stream.
func taskResults(t *testing.T, nc *nats.Conn) []tasks.TaskResultData {
	t.Helper()
	var out []tasks.TaskResultData
	for _, d := range inbox(t, nc) {
		if d.env.Kind != subjects.KindTaskResult {
			continue
		}
		var r tasks.TaskResultData
		if err := json.Unmarshal(d.env.Data, &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// TestCLITaskRun: the built binary runs a failing command as a task and
// the agent gets its failed result, with the exit code and the output,
// once, and task run exits with the command's code; a task run stopped
// with SIGTERM reports interrupted and exits 128+15.
func TestCLITaskRun(t *testing.T) {
	natsAddr := freeAddr(t)
	startServe(t, "tasks", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	out, errOut, code := chimeCLI(t, natsAddr, "task", "run", "--agent", "cli", "--id", "t3", "--", "sh", "-c", "echo hi; exit 3")
	if code != 3 {
		t.Fatalf("task run: exit %d, not the command's 3: %s", code, errOut)
	}
	first, _, _ := strings.Cut(out, "\n")
	if first != `{"task_id":"t3"}` {
		t.Fatalf("first line %q", first)
	}
	results := taskResults(t, nc)
	if len(results) != 1 || results[0].TaskID != "t3" || results[0].Status != tasks.TaskFailed ||
		results[0].ExitCode == nil || *results[0].ExitCode != 3 || !strings.Contains(results[0].Output, "hi") {
		t.Fatalf("results: %+v", results)
	}

	cmd := exec.Command(binary, "task", "run", "--agent", "cli", "--id", "sleepy", "--", "sleep", "30")
	cmd.Env = append(os.Environ(), "CHIME_NATS_URL=nats://"+natsAddr)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || !strings.Contains(lines.Text(), "sleepy") {
		t.Fatalf("no task_id line: %q", lines.Text())
	}
	time.Sleep(200 * time.Millisecond) // let the command start
	_ = cmd.Process.Signal(syscall.SIGTERM)
	for lines.Scan() {
	}
	if err := cmd.Wait(); cmd.ProcessState.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Fatalf("task run after SIGTERM: %v, not 143 (the command's signal)", err)
	}
	results = taskResults(t, nc)
	if len(results) != 2 || results[1].TaskID != "sleepy" || results[1].Status != tasks.TaskInterrupted {
		t.Fatalf("results: %+v", results)
	}
}

// TestCLITaskRunCancel: a task.cancel of a task `chime task run` is
// running stops the command (its whole process group) within about a
// second, keeps the output it printed, and reports cancelled with the
// command's status, which is also task run's exit code. Exit codes follow
// the command's: 0, its own code, 127 for a command not found, 128+n for
// a signal. A finished task's ID is refused before anything runs.
func TestCLITaskRunCancel(t *testing.T) {
	natsAddr := freeAddr(t)
	startServe(t, "tasks", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc, "cli")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd := exec.Command(binary, "task", "run", "--agent", "cli", "--id", "sleeper", "--",
		"sh", "-c", "echo $$ > "+pidFile+"; echo started; sleep 30; echo never")
	cmd.Env = append(os.Environ(), "CHIME_NATS_URL=nats://"+natsAddr)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill() }()
	var pid int
	testwait.Eventually(t, 10*time.Second, func() bool {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		task, err := c.GetTask(ctx, "sleeper")
		return pid > 0 && err == nil && task.AppendedBytes > 0 // "started" is stored
	})
	alive := func() bool { return syscall.Kill(-pid, 0) == nil }
	if !alive() {
		t.Fatal("the command's group is not running before the cancel")
	}
	cancelled := time.Now()
	if _, err := c.CancelTask(ctx, "sleeper"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() bool { return !alive() })
	t.Logf("the command's process group was gone %v after the cancel was acknowledged", time.Since(cancelled).Round(time.Millisecond))
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("task run did not exit after the cancel: %s", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("task run exit %d, not 143: %s", code, stderr.String())
	}
	task, err := c.GetTask(ctx, "sleeper")
	if err != nil || task.Status != tasks.TaskCancelled || task.ExitCode == nil || *task.ExitCode != 143 ||
		!strings.Contains(task.Output, "started") || strings.Contains(task.Output, "never") {
		t.Fatalf("task after the cancel: %+v %v", task, err)
	}
	if n := len(taskResults(t, nc)); n != 1 {
		t.Fatalf("%d task_result deliveries, want the cancel's one", n)
	}
	if !strings.Contains(stderr.String(), "cancelled") {
		t.Fatalf("stderr does not say why the command stopped: %q", stderr.String())
	}

	for _, x := range []struct {
		argv []string
		code int
	}{
		{[]string{"true"}, 0},
		{[]string{"sh", "-c", "exit 7"}, 7},
		{[]string{"/nonexistent/command"}, 127},
		{[]string{"sh", "-c", "kill -9 $$"}, 128 + 9},
	} {
		args := append([]string{"task", "run", "--agent", "cli", "--"}, x.argv...)
		if _, errOut, code := chimeCLI(t, natsAddr, args...); code != x.code {
			t.Errorf("%v: exit %d, want %d: %s", x.argv, code, x.code, errOut)
		}
	}

	marker := filepath.Join(t.TempDir(), "ran")
	_, errOut, code := chimeCLI(t, natsAddr, "task", "run", "--agent", "cli", "--id", "sleeper", "--", "touch", marker)
	if code == 0 || !strings.Contains(errOut, "task sleeper has already ended (cancelled): the command was not run") {
		t.Fatalf("a finished task's ID: exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran for a finished task")
	}
}
