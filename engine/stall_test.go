package engine_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/liveness"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testlog"
)

// A busy replica whose link stalls (the server cut off, no reset) gives
// the connection up within about liveness.WriteStall and reconnects, and
// says why.
func TestAStalledWriteReconnects(t *testing.T) {
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	natstest.ReconnectsAfterStall(t, 4*liveness.WriteStall, func(url string) (*nats.Conn, error) {
		return engine.Connect(engine.ConnectOptions{URL: url, Name: "stall"}, log)
	})
	if !strings.Contains(logs.String(), "i/o timeout") {
		t.Errorf("the stalled write is not what was logged:\n%s", logs.String())
	}
}
