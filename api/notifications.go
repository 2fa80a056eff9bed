package api

import (
	"net/http"
	"time"

	"github.com/chime-nats/chime/subjects"
)

// notificationFeeds registers the SSE feeds of notifications: one agent's
// (agent-readable, like the history) and all agents' (operators).
func notificationFeeds(mux *http.ServeMux, ops *Operations) {
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

// serveEvents streams the notification changes of agentID ("": all) as
// Server-Sent Events: after Last-Event-ID or ?since=N it replays every
// change after N first, then streams live. It ends when the client goes,
// chime stops, or the client falls behind (its feed's buffer or a write's
// deadline): the client then reconnects with Last-Event-ID and misses
// nothing.
func (o *Operations) serveEvents(w http.ResponseWriter, r *http.Request, agentID string) {
	if o.notifications == nil {
		writeError(w, &subjects.Error{Code: subjects.CodeUnavailable, Message: "notifications are not configured"})
		return
	}
	var since *uint64
	if n, ok, err := resumeAfter(r); err != nil {
		writeError(w, err)
		return
	} else if ok {
		since = &n
	}
	ctx, release, err := o.openStream(r)
	if err != nil {
		writeError(w, err)
		return
	}
	defer release()
	feed, err := o.notifications.Follow(ctx, agentID, since)
	if err != nil {
		writeError(w, answerError(err))
		return
	}
	defer feed.Close()
	s := startEventStream(w)
	if s == nil {
		return
	}
	for _, ev := range feed.Replay {
		s.add(ev.Seq, "notification", ev.Data)
		if s.full() && !s.send() {
			return
		}
	}
	if !s.send() {
		return
	}
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.comment("keepalive")
		case ev, ok := <-feed.C:
			if !ok {
				o.log.Debug("notification feed dropped: the client fell behind", "agent_id", agentID)
				return
			}
			s.add(ev.Seq, "notification", ev.Data)
			// Whatever else is waiting goes in the same write.
			for more := true; more && !s.full(); {
				select {
				case ev, ok := <-feed.C:
					if !ok {
						more = false
						break
					}
					s.add(ev.Seq, "notification", ev.Data)
				default:
					more = false
				}
			}
		}
		if !s.send() {
			return
		}
	}
}
