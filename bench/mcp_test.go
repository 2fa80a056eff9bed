package bench

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestMCP runs the MCP benchmark with tiny numbers: every call answers,
// every short wait is seen to end each way, and the run prints. The
// figures are not checked.
func TestMCP(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a chime")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var progress bytes.Buffer
	res, err := MCP(ctx, MCPOptions{N: 40, Clients: 4, Seconds: 60, Gets: 40, Visible: 2, VisibleClients: 2, WaitSeconds: 1,
		Poll: 50 * time.Millisecond, Tokens: true, Progress: &progress})
	if err != nil {
		t.Fatalf("MCP: %v\n%s", err, progress.String())
	}
	var text bytes.Buffer
	res.WriteText(&text)
	t.Logf("%s", text.String())
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]MCPPhase{"handle": res.Handle, "nats request": res.NATSRequest, "get": res.Get, "cancel": res.Cancel, "nats cancel": res.NATSCancel} {
		if p.N != 40 || p.LatencyMs.P50 <= 0 || p.PerS <= 0 {
			t.Errorf("%s: %+v", name, p)
		}
	}
	if len(res.Visible) != 5 || len(res.ServerPollMs) == 0 {
		t.Fatalf("visible: %+v, server intervals %v", res.Visible, res.ServerPollMs)
	}
	for _, v := range res.Visible {
		if v.N != 2 || v.Missed != 0 || v.LatenessMs.Max <= 0 {
			t.Errorf("%s: %+v", v.Way, v)
		}
	}
}
