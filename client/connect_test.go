package client_test

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/liveness"
	"github.com/chime-nats/chime/internal/natstest"
)

// An agent connected with ConnectOptions leaves a server whose link
// stalls (cut by the network, no reset) within seconds, busy as it is.
func TestConnectOptionsLeaveAStalledServer(t *testing.T) {
	natstest.ReconnectsAfterStall(t, 4*liveness.WriteStall, func(url string) (*nats.Conn, error) {
		return nats.Connect(url, client.ConnectOptions("agent-1", "")...)
	})
}
