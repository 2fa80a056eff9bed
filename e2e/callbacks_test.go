package e2e_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/callbacks"
)

// TestCLICallbacks drives the agent and callback commands of the built
// binary against a chime serve child, and posts to the URLs they hand out.
func TestCLICallbacks(t *testing.T) {
	natsAddr := freeAddr(t)
	startServe(t, "callbacks", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)
	run := func(args ...string) []byte {
		t.Helper()
		out, errOut, code := chimeCLI(t, natsAddr, append(args, "--agent", "hook")...)
		if code != 0 {
			t.Fatalf("chime %v: exit %d: %s", args, code, errOut)
		}
		return []byte(out)
	}
	postTo := func(url, body string) int {
		t.Helper()
		res, err := http.Post(url, "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}

	var started callbacks.LifecycleReply
	if err := json.Unmarshal(run("agent", "start"), &started); err != nil || started.Status != agents.AgentActive || len(started.Triggers) != 2 {
		t.Fatalf("agent start: %+v %v", started, err)
	}
	urls := map[callbacks.DeliveryMode]string{}
	for _, tr := range started.Triggers {
		urls[tr.Mode] = tr.TriggerURL
	}
	if code := postTo(urls[callbacks.ModeEnqueueMessage], "from the CLI's URL"); code != 200 {
		t.Fatalf("post to the started URL: %d", code)
	}

	var reset callbacks.ResetReply
	if err := json.Unmarshal(run("callback", "reset", "--mode", "enqueue_message"), &reset); err != nil || !reset.OK || reset.TriggerURL == urls[callbacks.ModeEnqueueMessage] {
		t.Fatalf("callback reset: %+v %v", reset, err)
	}
	if postTo(urls[callbacks.ModeEnqueueMessage], "old") != 403 || postTo(reset.TriggerURL, "new") != 200 {
		t.Error("after reset the old URL must be dead and the new one work")
	}
	var extra callbacks.TriggerView
	if err := json.Unmarshal(run("callback", "create", "--label", "ci"), &extra); err != nil || extra.Mode != callbacks.ModeWakeHint || extra.Label != "ci" {
		t.Fatalf("callback create: %+v %v", extra, err)
	}
	var cancelled callbacks.TriggerView
	if err := json.Unmarshal(run("callback", "cancel", extra.ID), &cancelled); err != nil || cancelled.Status != callbacks.TriggerRevoked {
		t.Fatalf("callback cancel: %+v %v", cancelled, err)
	}
	var list []callbacks.TriggerView
	if err := json.Unmarshal(run("callback", "list"), &list); err != nil || len(list) != 4 {
		t.Fatalf("callback list: %d %v", len(list), err)
	}
	for _, tr := range list {
		if tr.TriggerURL != "" {
			t.Errorf("list shows a URL for %s", tr.ID)
		}
	}

	run("agent", "stop")
	if postTo(reset.TriggerURL, "stopped") != 403 {
		t.Error("a stopped agent's URL must be dead")
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"callback", "reset"}, 1, "agent_not_active"},
		{[]string{"callback", "cancel", "trg_nope"}, 1, "trigger_not_found"},
		{[]string{"callback", "create", "--mode", "push"}, 1, "delivery_mode must be wake_hint or enqueue_message"},
		{[]string{"callback", "cancel"}, 2, "usage"},
		{[]string{"callback"}, 2, "usage"},
		{[]string{"agent", "restart"}, 2, "usage"},
	} {
		_, errOut, code := chimeCLI(t, natsAddr, append(tc.args, "--agent", "hook")...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("chime %v: exit %d %q, want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// TestServeRefusesOpenNetworkListener: without operator tokens, chime
// serve will not listen beyond loopback.
func TestServeRefusesOpenNetworkListener(t *testing.T) {
	cmd := exec.Command(binary, "serve")
	cmd.Env = append(os.Environ(), "CHIME_HTTP_ADDR=0.0.0.0:0", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+freeAddr(t))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(stderr.String(), "CHIME_OPERATOR_TOKENS_FILE is unset") {
			t.Errorf("serve on 0.0.0.0 without tokens: %v, %q", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("serve on 0.0.0.0 without tokens kept running")
	}
}
