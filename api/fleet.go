package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chime-nats/chime/fleet"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
)

// The fleet stream's bounds: each stream's buffer of changes not yet
// written (past it the page is told to read everything again, rather
// than the fleet's watches waiting on a slow page), and how many fleet
// streams one replica serves, whoever opens them (each principal is also
// held to CHIME_MAX_STREAMS_PER_PRINCIPAL).
const (
	fleetStreamBuffer = 256
	maxFleetStreams   = 64
	// maxFleetPage bounds a page of agents or questions.
	maxFleetPage = 500
	// maxSearch bounds ?q: an agent ID is at most subjects.MaxIDLen.
	maxSearch = subjects.MaxIDLen
)

// fleetViews registers the console's fleet views, operators' only (the
// guard's protected /api/fleet): the agents with their state and counts,
// the open questions across agents, and the changes of both as
// Server-Sent Events.
func fleetViews(mux *http.ServeMux, ops *Operations) {
	mux.HandleFunc("GET /api/fleet", func(w http.ResponseWriter, r *http.Request) {
		res, err := ops.fleetList(r)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, encode(res))
	})
	mux.HandleFunc("GET /api/fleet/questions", func(w http.ResponseWriter, r *http.Request) {
		res, err := ops.fleetQuestions(r)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, encode(res))
	})
	mux.HandleFunc("GET /api/fleet/events", ops.fleetEvents)
}

// badParam is a query parameter refused.
func badParam(format string, args ...any) error {
	return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf(format, args...)}
}

// fleetParams reads the query, each parameter at most once and only
// those allowed: a typo is refused rather than ignored.
func fleetParams(r *http.Request, allowed ...string) (map[string]string, error) {
	out := map[string]string{}
	for k, vs := range r.URL.Query() {
		if !slices.Contains(allowed, k) {
			if len(k) > 32 {
				k = k[:32] + "..."
			}
			return nil, badParam("unknown parameter %q: the parameters are %s", k, strings.Join(allowed, ", "))
		}
		if len(vs) > 1 {
			return nil, badParam("%s is given %d times: give it once", k, len(vs))
		}
		out[k] = vs[0]
	}
	return out, nil
}

// pageLimit reads ?limit: 1 to maxFleetPage, 50 when absent.
func pageLimit(v string) (int, error) {
	if v == "" {
		return subjects.DefaultListLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxFleetPage {
		if len(v) > 20 {
			v = v[:20] + "..."
		}
		return 0, badParam("limit must be a whole number from 1 to %d, not %q", maxFleetPage, v)
	}
	return n, nil
}

// fleetReady returns the fleet, or unavailable when this replica keeps
// none.
func (o *Operations) fleetReady() (*fleet.Index, error) {
	if o.fleet == nil {
		return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: "the fleet view is not configured"}
	}
	return o.fleet, nil
}

// fleetList serves GET /api/fleet?state=&q=&cursor=&limit=: a page of
// agents by ID. It reads the fleet's memory: no storage.
func (o *Operations) fleetList(r *http.Request) (res *fleet.Page, err error) {
	defer func() {
		err = o.finish("http:fleet", "request", err, "surface", "http", "action", "fleet")
	}()
	p, err := fleetParams(r, "state", "q", "cursor", "limit")
	if err != nil {
		return nil, err
	}
	q := fleet.Query{State: p["state"], Search: p["q"], After: p["cursor"]}
	if q.Limit, err = pageLimit(p["limit"]); err != nil {
		return nil, err
	}
	if q.State != "" && !slices.Contains(fleet.States, q.State) {
		return nil, badParam("state must be one of %s, not %q", strings.Join(fleet.States, ", "), clip(q.State))
	}
	if len(q.Search) > maxSearch || strings.Trim(q.Search, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "" {
		return nil, badParam("q must be at most %d of letters, digits, '_' and '-' (part of an agent ID), not %q", maxSearch, clip(q.Search))
	}
	if q.After != "" {
		if err := subjects.ValidateID("cursor", q.After); err != nil {
			return nil, badParam("cursor must be an agent ID (the next_cursor of a page): %s", subjects.AsError(err).Message)
		}
	}
	f, err := o.fleetReady()
	if err != nil {
		return nil, err
	}
	page := f.List(q)
	return &page, nil
}

// clip shortens a value quoted back in an error.
func clip(v string) string {
	if len(v) > 70 {
		return v[:70] + "..."
	}
	return v
}

// FleetQuestions is a page of open questions across agents, oldest first.
type FleetQuestions struct {
	Questions  []questions.Question `json:"questions"`
	NextCursor string               `json:"next_cursor,omitempty"`
	// Total is how many questions are open.
	Total int `json:"total"`
}

// fleetQuestions serves GET /api/fleet/questions?cursor=&limit=: the
// fleet names the page's open questions (memory), and each is read from
// the questions bucket, so a page costs its own reads only. One answered
// or gone since the fleet saw it is left out.
func (o *Operations) fleetQuestions(r *http.Request) (res *FleetQuestions, err error) {
	defer func() {
		err = o.finish("http:fleet.questions", "request", err, "surface", "http", "action", "fleet.questions")
	}()
	p, err := fleetParams(r, "cursor", "limit")
	if err != nil {
		return nil, err
	}
	limit, err := pageLimit(p["limit"])
	if err != nil {
		return nil, err
	}
	var after *fleet.OpenQuestion
	if c := p["cursor"]; c != "" {
		if after, err = parseQuestionCursor(c); err != nil {
			return nil, err
		}
	}
	f, err := o.fleetReady()
	if err != nil {
		return nil, err
	}
	if o.questions == nil {
		return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: "questions are not configured"}
	}
	names, more, total := f.OpenQuestions(after, limit)
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	res = &FleetQuestions{Questions: []questions.Question{}, Total: total}
	for _, n := range names {
		q, err := o.questions.Get(ctx, n.AgentID, n.ID)
		if err != nil && subjects.AsError(err).Code == questions.CodeQuestionNotFound {
			continue
		}
		if err != nil {
			return nil, answerError(err)
		}
		if q.Status == questions.QuestionOpen {
			res.Questions = append(res.Questions, *q)
		}
	}
	if more && len(names) > 0 {
		last := names[len(names)-1]
		res.NextCursor = strconv.FormatInt(last.CreatedAt.UnixNano(), 10) + "." + last.AgentID + "." + last.ID
	}
	return res, nil
}

// parseQuestionCursor reads a next_cursor of the questions' pages:
// <created_at, Unix ns>.<agent>.<question>.
func parseQuestionCursor(c string) (*fleet.OpenQuestion, error) {
	bad := func() error {
		return badParam("cursor must be the next_cursor of a page (<unix ns>.<agent_id>.<question_id>), not %q", clip(c))
	}
	parts := strings.Split(c, ".")
	if len(parts) != 3 {
		return nil, bad()
	}
	ns, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil || subjects.ValidateID("agent", parts[1]) != nil || subjects.ValidateID("question", parts[2]) != nil {
		return nil, bad()
	}
	return &fleet.OpenQuestion{AgentID: parts[1], ID: parts[2], CreatedAt: time.Unix(0, ns).UTC()}, nil
}

// fleetEvents serves GET /api/fleet/events: every change of an agent's
// summary as Server-Sent Events (id: the fleet's change seq, event:
// change, data: {seq, kind, agent, gone?}), after an event "hello" with
// the seq it starts from. Nothing is replayed: a page reads the views
// after hello (changes at or below a view's seq are in it). When the
// stream's buffer overflows, an event "reset" tells the page to read its
// views again; the stream goes on.
func (o *Operations) fleetEvents(w http.ResponseWriter, r *http.Request) {
	f, err := o.fleetReady()
	if err != nil {
		writeError(w, err)
		return
	}
	if _, err := fleetParams(r); err != nil {
		writeError(w, err)
		return
	}
	ctx, release, err := o.openStream(r)
	if err != nil {
		writeError(w, err)
		return
	}
	defer release()
	sub, cancel, err := f.Subscribe(fleetStreamBuffer, maxFleetStreams)
	if err != nil {
		writeError(w, &subjects.Error{Code: subjects.CodeUnavailable, Message: fmt.Sprintf("this replica serves %d fleet streams already: try again later", maxFleetStreams)})
		return
	}
	defer cancel()
	s := startEventStream(w)
	if s == nil {
		return
	}
	seq := f.Seq()
	s.add(seq, "hello", encode(map[string]uint64{"seq": seq}))
	if !s.send() {
		return
	}
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sub.Done():
			return
		case <-tick.C:
			s.comment("keepalive")
		case <-sub.Wake:
		case c := <-sub.C:
			s.add(c.Seq, "change", encode(c))
		}
		// What else is waiting goes in the same write.
		for more := true; more && !s.full(); {
			select {
			case c := <-sub.C:
				s.add(c.Seq, "change", encode(c))
			default:
				more = false
			}
		}
		if sub.Lost() {
			for len(sub.C) > 0 {
				<-sub.C
			}
			s.add(f.Seq(), "reset", []byte(`{}`))
		}
		if !s.send() {
			return
		}
	}
}
