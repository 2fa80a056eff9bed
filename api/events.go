package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// events writes Server-Sent Events to one client.
type events struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startEvents sends an event stream's headers. The server's write timeout
// covers a whole reply, which a stream never finishes: it is lifted here,
// and each write gets its own deadline instead (feedWriteTimeout), so a
// client that stops reading is dropped, not waited on.
func startEvents(w http.ResponseWriter) (*events, error) {
	rc := http.NewResponseController(w)
	if err := rc.SetWriteDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("api: event stream: %w", err)
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // a buffering proxy would hold events back
	w.WriteHeader(http.StatusOK)
	e := &events{w: w, rc: rc}
	return e, e.flush()
}

// event writes one event; data is one JSON document (no newlines once
// compact, which encode is).
func (e *events) event(id, name string, data []byte) error {
	if err := e.rc.SetWriteDeadline(time.Now().Add(feedWriteTimeout)); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(e.w, "id: %s\nevent: %s\ndata: %s\n\n", id, name, strings.ReplaceAll(string(data), "\n", "\ndata: ")); err != nil {
		return err
	}
	return e.flush()
}

// comment writes a comment line, which clients ignore.
func (e *events) comment(text string) error {
	if err := e.rc.SetWriteDeadline(time.Now().Add(feedWriteTimeout)); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(e.w, ": %s\n\n", text); err != nil {
		return err
	}
	return e.flush()
}

func (e *events) flush() error { return e.rc.Flush() }

// streamContext is a stream's context: it ends with the request (the
// client left) or when the gateway stops (gatewayStopping). Shutdown waits
// for connections to go idle and cancels no request, so without this a
// stream would hold the shutdown to its deadline.
func streamContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	if stopping := gatewayStopping(r.Context()); stopping != nil {
		go func() {
			select {
			case <-stopping:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, cancel
}
