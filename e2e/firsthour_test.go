package e2e_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// TestFirstHour is what an operator meets in a first hour besides the
// README's examples (TestREADME): each mistake a fresh machine invites
// makes `chime serve` exit at once, non-zero, with one line that names the
// cause and the setting to change; and `chime --version` answers.
func TestFirstHour(t *testing.T) {
	dir := t.TempDir()

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	nobody := freeAddr(t) // nothing listens there

	// A NATS server that wants a token chime does not have.
	tokenPort, err := strconv.Atoi(strings.TrimPrefix(freeAddr(t), "127.0.0.1:"))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: tokenPort, Authorization: "right", NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server with a token: not ready")
	}
	tokenURL := "nats://127.0.0.1:" + strconv.Itoa(tokenPort)

	for _, tc := range []struct {
		name string
		env  []string
		want []string // in the one line that says why
	}{
		{
			"nats port in use",
			[]string{"CHIME_NATS_LISTEN=" + busy.Addr().String()},
			[]string{"the NATS address " + busy.Addr().String() + " is in use", "CHIME_NATS_LISTEN"},
		},
		{
			"data dir under a file",
			[]string{"CHIME_DATA_DIR=" + filepath.Join(file, "data")},
			[]string{"cannot make the data dir " + filepath.Join(file, "data"), "CHIME_DATA_DIR"},
		},
		{
			"no NATS at CHIME_NATS_URL",
			[]string{"CHIME_NATS_URL=nats://" + nobody},
			[]string{"no NATS server answered at nats://" + nobody + " (CHIME_NATS_URL): connect: connection refused"},
		},
		{
			"NATS refuses the token",
			[]string{"CHIME_NATS_URL=" + tokenURL, "CHIME_NATS_TOKEN=wrong"},
			[]string{"NATS at " + tokenURL + " refused chime's credentials", "CHIME_NATS_TOKEN"},
		},
		{
			"HTTP beyond loopback without operator tokens",
			[]string{"CHIME_HTTP_ADDR=0.0.0.0:8080"},
			[]string{`CHIME_HTTP_ADDR "0.0.0.0:8080" is not a loopback address`, "CHIME_OPERATOR_TOKENS_FILE is unset"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A fresh machine's settings, then the mistake (later wins).
			env := append([]string{
				"CHIME_DATA_DIR=" + filepath.Join(t.TempDir(), "data"),
				"CHIME_NATS_LISTEN=" + freeAddr(t),
				"CHIME_HTTP_ADDR=" + freeAddr(t),
			}, tc.env...)
			code, stderr := serveFails(t, env)
			if code == 0 {
				t.Fatalf("chime serve exited 0; stderr:\n%s", stderr)
			}
			var said []string
			for l := range strings.SplitSeq(strings.TrimSpace(stderr), "\n") {
				if !strings.Contains(l, "level=") { // not a log line: what chime says
					said = append(said, l)
				}
			}
			if len(said) != 1 || !strings.HasPrefix(said[0], "chime: ") {
				t.Fatalf("want one line `chime: ...` naming the cause, got %q; stderr:\n%s", said, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(said[0], w) {
					t.Errorf("%q: no %q", said[0], w)
				}
			}
		})
	}

	t.Run("version", func(t *testing.T) {
		cmd := exec.Command(binary, "--version")
		cmd.Env = cleanEnv()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chime --version: %v", err)
		}
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || lines[0] == "" {
			t.Errorf("chime --version printed %q, want one line", out)
		}
	})
}

// serveFails runs `chime serve` with env, which must end by itself; its
// exit code and stderr.
func serveFails(t *testing.T, env []string) (int, string) {
	t.Helper()
	cmd := exec.Command(binary, "serve")
	cmd.Env = append(cleanEnv(), env...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("chime serve still running after 15s; it printed:\n%s", stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}
