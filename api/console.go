package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/subjects"
)

// consoleViews are the operator's views that are no agent's action (HTTP
// only): the agent list, an agent's recent deliveries and their live feed
// (Server-Sent Events, or WebSocket frames).
func consoleViews(mux *http.ServeMux, ops *Operations) {
	view := func(pattern string, read func(r *http.Request) (any, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			res, err := read(r)
			if err != nil {
				writeError(w, err)
				return
			}
			writeJSON(w, http.StatusOK, encode(res))
		})
	}
	view("GET /api/agents", func(r *http.Request) (any, error) { return ops.Agents(r.Context()) })
	view("GET /api/agents/{id}/inbox", func(r *http.Request) (any, error) {
		limit, err := subjects.ParseLimit(limitParam(r))
		if err != nil {
			return nil, err
		}
		src, err := sourceParam(r)
		if err != nil {
			return nil, err
		}
		if src != nil {
			return ops.InboxFrom(r.Context(), r.PathValue("id"), *src, limit)
		}
		return ops.Inbox(r.Context(), r.PathValue("id"), limit)
	})
	mux.HandleFunc("GET /api/agents/{id}/inbox/events", ops.inboxEvents)
	mux.HandleFunc("GET /api/agents/{id}/inbox/ws", ops.inboxWebSocket)
}

// limitParam is ?limit as ParseLimit reads it.
func limitParam(r *http.Request) []byte {
	if l := r.URL.Query().Get("limit"); l != "" {
		return encode(action.RawOrString(l))
	}
	return nil
}

// sourceParam is ?source=TYPE:ID, the source whose deliveries the recent
// deliveries are limited to (a monitor's: monitor:<monitor_id>), or nil
// when absent. TYPE is 1-32 of [a-z_], ID follows the ID rule.
func sourceParam(r *http.Request) (*subjects.Source, error) {
	vs, ok := r.URL.Query()["source"]
	if !ok {
		return nil, nil
	}
	bad := func(why string) error {
		v := vs[0]
		if len(v) > 100 {
			v = v[:100] + "..."
		}
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("source must be TYPE:ID (a monitor's: monitor:<monitor_id>), not %q: %s", v, why)}
	}
	if len(vs) > 1 {
		return nil, bad("give it once")
	}
	typ, id, found := strings.Cut(vs[0], ":")
	if !found {
		return nil, bad("no ':'")
	}
	if typ == "" || len(typ) > 32 || strings.TrimLeft(typ, "abcdefghijklmnopqrstuvwxyz_") != "" {
		return nil, bad("the type is 1-32 of a-z and '_'")
	}
	if err := subjects.ValidateID("the id", id); err != nil {
		return nil, bad(err.(*subjects.Error).Message)
	}
	return &subjects.Source{Type: typ, ID: id}, nil
}

// view runs an operator's read that is no agent action, bounded and
// counted as Do runs actions; agentID, when not empty, is validated first.
func (o *Operations) view(ctx context.Context, endpoint, agentID string, read func(context.Context) (any, error)) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var res any
	var err error
	if agentID != "" {
		err = subjects.ValidateID("agent_id", agentID)
	}
	if err == nil {
		if o.deliveries == nil || o.agents == nil {
			err = &subjects.Error{Code: subjects.CodeUnavailable, Message: "the operator views are not configured"}
		} else {
			res, err = read(ctx)
		}
	}
	return res, o.finish("http:"+endpoint, "request", err, "surface", "http", "action", endpoint, "agent_id", agentID)
}

// Agents lists the agents chime knows: those with a record in the agents
// bucket (started, stopped, paused, intervened on, woken), with
// deliveries in the inbox stream, or with notifications, by ID.
func (o *Operations) Agents(ctx context.Context) (*agents.ListAgentsReply, error) {
	res, err := o.view(ctx, "agents", "", func(ctx context.Context) (any, error) {
		records, err := o.agents.List(ctx)
		if err != nil {
			return nil, err
		}
		counts, err := o.deliveries.Agents(ctx)
		if err != nil {
			return nil, err
		}
		byID := make(map[string]*agents.AgentSummary, len(records)+len(counts))
		for _, st := range records {
			byID[st.AgentID] = &agents.AgentSummary{AgentID: st.AgentID, Status: st.Status, PausedAt: st.PausedAt}
		}
		summary := func(id string) *agents.AgentSummary {
			if byID[id] == nil {
				byID[id] = &agents.AgentSummary{AgentID: id}
			}
			return byID[id]
		}
		for id, n := range counts {
			summary(id).Deliveries = n
		}
		if o.notifications != nil {
			notes, err := o.notifications.Agents(ctx)
			if err != nil {
				return nil, err
			}
			for id, c := range notes {
				a := summary(id)
				a.Notifications, a.Unread = c.Total, c.Unread
			}
		}
		reply := &agents.ListAgentsReply{Agents: make([]agents.AgentSummary, 0, len(byID))}
		for _, a := range byID {
			reply.Agents = append(reply.Agents, *a)
		}
		slices.SortFunc(reply.Agents, func(a, b agents.AgentSummary) int { return strings.Compare(a.AgentID, b.AgentID) })
		return reply, nil
	})
	if err != nil {
		return nil, err
	}
	return res.(*agents.ListAgentsReply), nil
}

// Inbox returns the agent's last limit deliveries, newest first.
func (o *Operations) Inbox(ctx context.Context, agentID string, limit int) (any, error) {
	return o.view(ctx, "inbox", agentID, func(ctx context.Context) (any, error) {
		return o.deliveries.Recent(ctx, agentID, limit)
	})
}

// InboxFrom returns the agent's last limit deliveries from src, newest
// first, from among its last deliveries.SourceScan.
func (o *Operations) InboxFrom(ctx context.Context, agentID string, src subjects.Source, limit int) (any, error) {
	return o.view(ctx, "inbox", agentID, func(ctx context.Context) (any, error) {
		return o.deliveries.RecentFrom(ctx, agentID, src, limit, deliveries.SourceScan)
	})
}

// inboxEvents serves GET /api/agents/{id}/inbox/events: the agent's
// deliveries (inboxFeed) as Server-Sent Events (id: the stream sequence,
// event: delivery, data: {seq, stored_at, envelope}), as fast as the
// client takes them, until the client leaves or the gateway stops. A
// client that reconnects with Last-Event-ID misses nothing the stream
// still holds.
func (o *Operations) inboxEvents(w http.ResponseWriter, r *http.Request) {
	fd, err := o.openInboxFeed(r, "inbox.events")
	if err != nil {
		writeError(w, err)
		return
	}
	defer fd.Close()
	s := startEventStream(w)
	if s == nil {
		return
	}
	for {
		list, err := fd.next(fd.ctx)
		switch {
		case fd.ctx.Err() != nil: // the client left or the gateway stops
			return
		case err != nil:
			// The client resumes with Last-Event-ID.
			o.log.Debug("inbox feed ended", "agent_id", fd.agentID, "after", fd.After(), "err", err)
			return
		case len(list) == 0:
			s.comment("keepalive")
		}
		for _, d := range list {
			s.add(d.Seq, "delivery", encode(d))
		}
		if !s.send() {
			return
		}
	}
}
