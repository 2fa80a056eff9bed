package mcp_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/waits"
)

// TestTypeScriptClient runs the flows of the go-sdk tests with a second,
// independent client: the TypeScript SDK (@modelcontextprotocol/sdk, the
// version e2e/mcpts/package-lock.json pins), driven by e2e/mcpts/flows.mjs
// on Node. It needs node and npm, and the npm registry once (the install
// is cached by the lock file's hash). Without node or npm it skips, but
// fails where CI is set: CI must not pass by skipping it.
func TestTypeScriptClient(t *testing.T) {
	node, npm := tool(t, "node"), tool(t, "npm")
	dir := installFlows(t, npm)

	c := startChime(t)
	token := issueToken(t, c.nats(t), "ts")
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "flows.mjs"), c.url("ts"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CHIME_MCP_TOKEN="+token, "CHIME_MCPTS_BUDGET_MS=50000")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	t.Logf("the TypeScript client's summary:\n%s", out)
	if stderr.Len() > 0 {
		t.Logf("its stderr:\n%s", stderr.Bytes())
	}
	var sum tsSummary
	if jerr := json.Unmarshal(out, &sum); jerr != nil {
		t.Fatalf("node flows.mjs: %v; its output is no summary: %v", err, jerr)
	}
	if err != nil || !sum.OK {
		t.Errorf("node flows.mjs: %v", err)
	}
	if !sum.Connect.OK {
		t.Fatalf("connect: %s", sum.Connect.Error)
	}
	// The TypeScript SDK speaks 2025-11-25 (its newest) through initialize:
	// the handshake chime answers beside the stateless 2026-07-28.
	if sum.Connect.ProtocolVersion != "2025-11-25" || !sum.Connect.TasksExtension {
		t.Errorf("connect: %+v", sum.Connect)
	}
	for _, name := range []string{"tools", "timer", "badInput", "waitBlocking", "waitTask", "questionTask", "cancel", "unknownTask"} {
		f, ok := sum.Flows[name]
		switch {
		case !ok:
			t.Errorf("flow %s did not run", name)
		case !f.OK:
			t.Errorf("flow %s: %s", name, f.Error)
		}
	}
	// tasks/cancel ended the hour's wait itself, and every wait ended.
	list, err := mustClient(t, c, "ts").ListWaits(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var cancelled int
	for _, w := range list.Waits {
		if !w.Ended() || (w.Status == waits.WaitCancelled) != (w.TargetTime.Sub(w.CreatedAt) > 30*time.Minute) {
			t.Errorf("wait %s (for %v) is %s", w.ID, w.TargetTime.Sub(w.CreatedAt), w.Status)
		}
		if w.Status == waits.WaitCancelled {
			cancelled++
		}
	}
	if len(list.Waits) != 3 || cancelled != 1 {
		t.Errorf("%d waits, %d cancelled; want 3 waits (two of a second, one of an hour), the hour's cancelled", len(list.Waits), cancelled)
	}
	for _, e := range sum.TransportErrors {
		t.Errorf("the transport's error: %s", e)
	}
	if strings.Contains(string(out), token) || strings.Contains(stderr.String(), token) {
		t.Error("the client printed the token")
	}
}

// tsSummary is what flows.mjs prints.
type tsSummary struct {
	OK      bool   `json:"ok"`
	Node    string `json:"node"`
	Error   string `json:"error"`
	Connect struct {
		OK              bool   `json:"ok"`
		Error           string `json:"error"`
		ProtocolVersion string `json:"protocolVersion"`
		TasksExtension  bool   `json:"tasksExtension"`
	} `json:"connect"`
	Flows map[string]struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	} `json:"flows"`
	TransportErrors []string `json:"transportErrors"`
}

// tool finds a command the test needs: missing, the test skips, or fails
// under CI.
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := name + " is not installed: the TypeScript SDK's MCP flows (e2e/mcpts) need Node.js and npm " +
		"(Debian: apt-get install nodejs npm, as .ci/run does)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// installFlows installs e2e/mcpts's locked dependencies with npm ci, once
// per lock file (in the user's cache, keyed by the lock's hash), and
// returns a directory holding this tree's flows.mjs beside them.
func installFlows(t *testing.T, npm string) string {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("..", "e2e", "mcpts"))
	if err != nil {
		t.Fatal(err)
	}
	pkg := readFile(t, filepath.Join(src, "package.json"))
	lock := readFile(t, filepath.Join(src, "package-lock.json"))
	h := sha256.New()
	h.Write(pkg)
	h.Write([]byte{0})
	h.Write(lock)
	key := "mcpts-" + hex.EncodeToString(h.Sum(nil))[:16]
	base, err := os.UserCacheDir()
	if err == nil {
		base = filepath.Join(base, "chime")
		err = os.MkdirAll(base, 0o755)
	}
	if err != nil {
		base = t.TempDir() // no cache: install for this run alone
	}
	modules := filepath.Join(base, key)
	if _, err := os.Stat(filepath.Join(modules, "installed")); err != nil {
		// Install beside, then rename into place: a run that dies halfway,
		// or another at the same time, leaves no half install under key.
		tmp, err := os.MkdirTemp(base, key+".tmp-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(tmp)
		writeFile(t, filepath.Join(tmp, "package.json"), pkg)
		writeFile(t, filepath.Join(tmp, "package-lock.json"), lock)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--prefer-offline")
		cmd.Dir = tmp
		cmd.WaitDelay = 5 * time.Second
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in e2e/mcpts (the npm registry must be reachable): %v\n%s", err, out)
		}
		t.Logf("npm ci: %v", time.Since(start).Round(100*time.Millisecond))
		writeFile(t, filepath.Join(tmp, "installed"), nil)
		if err := os.Rename(tmp, modules); err != nil && !errors.Is(err, os.ErrExist) {
			if _, serr := os.Stat(filepath.Join(modules, "installed")); serr != nil {
				t.Fatal(err) // not another run's install either
			}
		}
	}
	// The script runs from a directory of its own under the install, so
	// that its imports resolve to the install's node_modules and each run
	// has this tree's script.
	run, err := os.MkdirTemp(modules, "run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	writeFile(t, filepath.Join(run, "flows.mjs"), readFile(t, filepath.Join(src, "flows.mjs")))
	return run
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
