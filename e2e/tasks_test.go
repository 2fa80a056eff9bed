package e2e_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
// once; a task run stopped with SIGTERM reports interrupted.
func TestCLITaskRun(t *testing.T) {
	natsAddr := freeAddr(t)
	startServe(t, "tasks", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	out, errOut, code := chimeCLI(t, natsAddr, "task", "run", "--agent", "cli", "--id", "t3", "--", "sh", "-c", "echo hi; exit 3")
	if code != 0 {
		t.Fatalf("task run: exit %d: %s", code, errOut)
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
	if err := cmd.Wait(); err != nil {
		t.Fatalf("task run after SIGTERM: %v", err)
	}
	results = taskResults(t, nc)
	if len(results) != 2 || results[1].TaskID != "sleepy" || results[1].Status != tasks.TaskInterrupted {
		t.Fatalf("results: %+v", results)
	}
}
