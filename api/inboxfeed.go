package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/chime-nats/chime/deliveries"
)

// inboxFeed is one client's live read of an agent's deliveries, the one
// read both of its feeds send (Server-Sent Events, WebSocket frames): from
// after Last-Event-ID or ?since, else after the agent's cursor (what it
// has not acked), read as inbox.fetch reads (a batch at a time, woken by
// each delivery's publish; no JetStream consumer). It never moves the
// cursor: the agent acks what it handled.
type inboxFeed struct {
	// ctx ends when the client leaves, the gateway stops or the
	// principal's token is revoked.
	ctx     context.Context
	agentID string
	f       *deliveries.Follower
	release func()
}

// openInboxFeed opens r's feed: it reads the resume point, takes one of
// the principal's stream places and starts the follower. Close it.
func (o *Operations) openInboxFeed(r *http.Request, endpoint string) (*inboxFeed, error) {
	agentID := r.PathValue("id")
	after, resume, err := resumeAfter(r)
	if err != nil {
		return nil, err
	}
	ctx, release, err := o.openStream(r)
	if err != nil {
		return nil, err
	}
	// The follower lives as long as the stream, not the view's request
	// timeout, which bounds only the cursor's read and the subscription.
	res, err := o.view(ctx, endpoint, agentID, func(vctx context.Context) (any, error) {
		if !resume {
			st, _, err := o.agents.Get(vctx, agentID)
			if err != nil {
				return nil, err
			}
			after = st.InboxAcked
		}
		return o.deliveries.Follow(vctx, agentID, after)
	})
	if err != nil {
		release()
		return nil, err
	}
	return &inboxFeed{ctx: ctx, agentID: agentID, f: res.(*deliveries.Follower), release: release}, nil
}

// Close ends the follower and gives the stream place back.
func (fd *inboxFeed) Close() {
	fd.f.Close()
	fd.release()
}

// next returns the next deliveries, oldest first, waiting at most a
// keepalive under ctx: none and no error when none came meanwhile, or the
// engine did not answer (the feed waits out its absence: send a
// keepalive and call again). An error ends the feed; the client resumes
// after the last sequence it got and loses nothing the stream holds.
func (fd *inboxFeed) next(ctx context.Context) ([]deliveries.Delivery, error) {
	nctx, cancel := context.WithTimeout(ctx, keepalive)
	defer cancel()
	list, err := fd.f.Next(nctx, deliveries.DefaultInboxFetch)
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return nil, nil
	}
	return list, err
}

// After is the last sequence the feed read.
func (fd *inboxFeed) After() uint64 { return fd.f.After() }
