package api_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// TestKVMonitorOverNATS: with CHIME_MONITOR_KV open, an agent's kv
// monitor, run on the replica holding its shard, delivers the changes of
// its keys made after its start; another agent's keys, chime's buckets
// and a bucket that does not exist are refused.
func TestKVMonitorOverNATS(t *testing.T) {
	_, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.MonitorKV = "builds/{agent}.>,gone/>" })
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "builds"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "agent-k.old", "before the start"); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(nc, "agent-k")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ kv, code, text string }{
		{"builds/agent-j.>", monitors.CodeKVNotAllowed, "not within the keys open to monitors (CHIME_MONITOR_KV: builds/{agent}.>, gone/>)"},
		{"chime_monitors/agent-j.>", monitors.CodeKVNotAllowed, "chime's own"},
		{"gone/x", monitors.CodeKVBucketNotFound, "kv bucket gone does not exist"},
		{"builds", subjects.CodeInvalidRequest, "must be <bucket>/<key>"},
	} {
		err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"d","kv":"`+tc.kv+`"}`), &struct{}{})
		var wire *subjects.Error
		if !errors.As(err, &wire) || wire.Code != tc.code || !strings.Contains(wire.Message, tc.text) {
			t.Errorf("%s: %v", tc.kv, err)
		}
	}
	var m monitors.Monitor
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"builds","kv":"builds/agent-k.>"}`), &m); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "agent-k.web", "failed"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		var texts []string
		for _, env := range fetchKind(t, c, subjects.KindMonitorEvent) {
			texts = append(texts, env.Text)
		}
		all := strings.Join(texts, "\n")
		return strings.Contains(all, "agent-k.web PUT failed") && !strings.Contains(all, "before the start"), all
	}, "a change as a monitor_event")
}
