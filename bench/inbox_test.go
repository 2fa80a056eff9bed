package bench

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestInbox runs the inbox benchmark with few agents: every one reads its
// delivery once across the nats-server's restart, and the run measures
// and prints. The figures are not checked.
func TestInbox(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server and chime processes")
	}
	exe := chimeBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	res, err := Inbox(ctx, InboxOptions{Agents: 300, InFlight: 16, Conns: 2, Lead: 3 * time.Second, Max: 4, Timeout: 2 * time.Second,
		Restart: true, Exe: exe, Progress: &progress})
	if err != nil {
		t.Fatalf("Inbox: %v\n%s", err, progress.String())
	}
	var text bytes.Buffer
	res.WriteText(&text)
	t.Logf("%s", text.String())
	if err := res.Err(); err != nil || res.Delivered != 300 || res.Verified != 300 || res.Restart == nil || res.Restart.FirstFetchMs <= 0 ||
		res.Cold == nil || res.Cold.ServerRSS <= 0 || res.FetchMs.P50 <= 0 || res.AgentsBucketBytes == 0 {
		t.Errorf("inbox: %v %+v\n%s", err, res, progress.String())
	}
}
