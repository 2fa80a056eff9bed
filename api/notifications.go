package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/chime-nats/chime/subjects"
)

// notification serves notify, the console's create, and the history,
// mark-read and clear of notifications.
func (o *Operations) notification(ctx context.Context, action, agentID string, body []byte) (any, error) {
	if o.notifications == nil {
		return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: "notifications are not configured"}
	}
	switch action {
	case subjects.ActionNotify, subjects.ActionNotificationsCreate:
		src := subjects.FromAgent
		if action == subjects.ActionNotificationsCreate {
			src = subjects.FromHTTP
		}
		n, err := subjects.DecodeNotify(body, src)
		if err != nil {
			return nil, err
		}
		item, err := o.notifications.Notify(ctx, agentID, n)
		if err != nil {
			return nil, err
		}
		if src == subjects.FromHTTP {
			return subjects.CreateNotificationReply{Success: true, NotificationID: item.ID, Message: subjects.NotificationCreatedText}, nil
		}
		return subjects.NotifyReply{ID: item.ID, Message: subjects.NotificationSentText}, nil
	case subjects.ActionNotificationsList:
		since, err := subjects.DecodeListNotifications(body)
		if err != nil {
			return nil, err
		}
		return o.notifications.List(ctx, agentID, since)
	case subjects.ActionNotificationsMark:
		ids, all, err := subjects.DecodeMarkRead(body)
		if err != nil {
			return nil, err
		}
		n, err := o.notifications.MarkRead(ctx, agentID, ids, all)
		if err != nil {
			return nil, err
		}
		if all {
			return subjects.MarkReadReply{Success: true, Message: subjects.AllMarkedReadText}, nil
		}
		return subjects.MarkReadReply{Success: true, MarkedCount: &n, Message: subjects.MarkedReadText(n)}, nil
	}
	if err := subjects.DecodeNoFields(body); err != nil {
		return nil, err
	}
	guid, err := o.notifications.Clear(ctx, agentID)
	if err != nil {
		return nil, err
	}
	return subjects.ClearReply{Success: true, Message: subjects.AllClearedText, GUID: guid}, nil
}

// routeFunc registers a route that runs an action (see NewHandler).
type routeFunc func(pattern, action string, body func(r *http.Request, read []byte) []byte, status int)

// notificationRoutes registers the notification routes: Agent Zero's
// create, history, mark-read and clear, and the SSE feeds of one agent
// (agent-readable, like the history) and of all (operators).
func notificationRoutes(mux *http.ServeMux, ops *Operations, route routeFunc) {
	asSent := func(_ *http.Request, read []byte) []byte { return read }
	route("POST /api/control/agents/{id}/notifications", subjects.ActionNotificationsCreate, asSent, http.StatusOK)
	route("GET /api/agents/{id}/notifications", subjects.ActionNotificationsList, func(r *http.Request, _ []byte) []byte {
		if since := r.URL.Query().Get("since"); since != "" {
			return encode(map[string]any{"since": rawOrString(since)})
		}
		return nil
	}, http.StatusOK)
	route("POST /api/control/agents/{id}/notifications/mark-read", subjects.ActionNotificationsMark, asSent, http.StatusOK)
	route("POST /api/control/agents/{id}/notifications/clear", subjects.ActionNotificationsClear, asSent, http.StatusOK)
	mux.HandleFunc("GET /api/agents/{id}/notifications/events", func(w http.ResponseWriter, r *http.Request) {
		agentID := r.PathValue("id")
		if err := subjects.ValidateID("agent_id", agentID); err != nil {
			writeError(w, err)
			return
		}
		ops.serveEvents(w, r, agentID)
	})
	mux.HandleFunc("GET /api/notifications/events", func(w http.ResponseWriter, r *http.Request) {
		ops.serveEvents(w, r, "")
	})
}

// SSE timing: a comment every keepalive holds proxies and the client's
// connection open; a write that has not gone out within sseWriteTimeout
// is a client not reading, which is dropped.
const (
	keepalive       = 15 * time.Second
	sseWriteTimeout = 10 * time.Second
)

// serveEvents streams the notification changes of agentID ("": all) as
// Server-Sent Events: with ?since=N or Last-Event-ID (which wins: it is
// where a reconnecting client stopped) it replays every change after N
// first, then streams live. It ends when the client goes, chime stops, or
// the client falls behind (its feed's buffer or a write's deadline): the
// client then reconnects with Last-Event-ID and misses nothing.
func (o *Operations) serveEvents(w http.ResponseWriter, r *http.Request, agentID string) {
	if o.notifications == nil {
		writeError(w, &subjects.Error{Code: subjects.CodeUnavailable, Message: "notifications are not configured"})
		return
	}
	var since *uint64
	for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("since")} {
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "since (or Last-Event-ID) must be a sequence number, not " + strconv.Quote(v)})
			return
		}
		since = &n
		break
	}
	rc := http.NewResponseController(w)
	// The gateway's write timeout bounds a whole reply; a stream lifts it
	// and bounds each write instead.
	if err := rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout)); err != nil {
		writeError(w, &subjects.Error{Code: subjects.CodeInternal, Message: "this connection cannot stream"})
		return
	}
	feed := o.notifications.Follow(agentID, since)
	defer feed.Close()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	buf := make([]byte, 0, 4096)
	send := func() bool {
		if err := rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout)); err != nil {
			return false
		}
		if _, err := w.Write(buf); err != nil {
			return false
		}
		buf = buf[:0]
		return rc.Flush() == nil
	}
	for _, ev := range feed.Replay {
		buf = appendEvent(buf, ev.Seq, ev.Data)
		if len(buf) > 64<<10 && !send() {
			return
		}
	}
	buf = append(buf, ": connected\n\n"...)
	if !send() {
		return
	}
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	stopping := gatewayStopping(r.Context())
	for {
		select {
		case <-r.Context().Done():
			return
		case <-stopping:
			return
		case <-tick.C:
			buf = append(buf, ": keepalive\n\n"...)
		case ev, ok := <-feed.C:
			if !ok {
				o.log.Debug("notification feed dropped: the client fell behind", "agent_id", agentID)
				return
			}
			buf = appendEvent(buf, ev.Seq, ev.Data)
			// Whatever else is waiting goes in the same write.
			for more := true; more && len(buf) < 64<<10; {
				select {
				case ev, ok := <-feed.C:
					if !ok {
						more = false
						break
					}
					buf = appendEvent(buf, ev.Seq, ev.Data)
				default:
					more = false
				}
			}
		}
		if !send() {
			return
		}
	}
}

// appendEvent appends one SSE event: its sequence as the id, the change
// JSON (one line) as the data.
func appendEvent(buf []byte, seq uint64, data []byte) []byte {
	buf = append(buf, "id: "...)
	buf = strconv.AppendUint(buf, seq, 10)
	buf = append(buf, "\nevent: notification\ndata: "...)
	buf = append(buf, data...)
	return append(buf, "\n\n"...)
}

// stoppingKey holds, in a request's context, the channel the gateway
// closes when it shuts down: streams end then, while other requests are
// let finish.
type stoppingKey struct{}

func gatewayStopping(ctx context.Context) <-chan struct{} {
	c, _ := ctx.Value(stoppingKey{}).(chan struct{})
	return c // nil outside a Gateway: never closed
}
