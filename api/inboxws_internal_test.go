package api

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestWebSocketOutlivesTheGatewayTimeouts: a WebSocket accepted by
// acceptWebSocket is not cut by the gateway's read and write timeouts,
// which bound whole requests and stay on a hijacked connection: a frame
// sent and one read well after both have passed still get through.
func TestWebSocketOutlivesTheGatewayTimeouts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const short = 200 * time.Millisecond
	served := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := acceptWebSocket(w, r)
		if err != nil {
			served <- err
			return
		}
		defer c.CloseNow()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		time.Sleep(5 * short)
		if err := c.Write(ctx, websocket.MessageText, []byte("late")); err != nil {
			served <- err
			return
		}
		_, _, err = c.Read(ctx) // the client's close, read after the read timeout
		served <- err
	})
	g := NewGateway(ln, h, slog.New(slog.NewTextHandler(io.Discard, nil)), Timeouts{ReadHeader: short, Read: short, Write: short, Idle: short})
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer g.Stop(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+g.Addr()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, b, err := c.Read(ctx); err != nil || string(b) != "late" {
		t.Fatalf("the late frame: %q %v", b, err)
	}
	time.Sleep(5 * short)
	_ = c.Close(websocket.StatusNormalClosure, "done")
	if err := <-served; websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("the server's read after the timeouts: %v", err)
	}
}
