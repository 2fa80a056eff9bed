package waits

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
)

// Requests serves what agents and operators ask of waits beyond the
// record itself: a cancel with its delivery, and interventions.
type Requests struct {
	store *Store
	inbox *consumer.Inbox
	js    jetstream.JetStream
	now   func() time.Time
	log   *slog.Logger
}

// NewRequests returns the wait requests over store; interventions are
// stored in js's events stream, deliveries go through inbox.
func NewRequests(store *Store, inbox *consumer.Inbox, js jetstream.JetStream, now func() time.Time, log *slog.Logger) *Requests {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Requests{store: store, inbox: inbox, js: js, now: now, log: log.With("component", "waits")}
}

// Cancel cancels a waiting wait at the agent's request, delivers its
// wait_cancelled envelope, and returns the record once that is stored.
// Cancelling an ended wait returns it unchanged; a repeat of a cancel whose
// delivery failed delivers it (the envelope ID keeps it single).
func (o *Requests) Cancel(ctx context.Context, agentID, waitID string) (*Wait, error) {
	w, ended, err := o.store.Cancel(ctx, agentID, waitID, CancelByRequest, "Wait cancelled.")
	if err != nil || !ended {
		return w, err
	}
	env := WaitEndEnvelope(w, w.CancelText, o.now())
	if _, err := o.inbox.DeliverOnce(ctx, &env, endedAt(w)); err != nil {
		// The wait is cancelled; its delivery is not stored yet. The
		// error makes the caller retry, and the retry delivers.
		return nil, fmt.Errorf("waits: deliver the cancel of %s: %w", waitID, err)
	}
	return w, nil
}

// Room is the most an inbox delivery may carry (see consumer.Inbox.Room).
func (o *Requests) Room() int64 { return o.inbox.Room() }

// Intervene stores the intervention as an event on the agent's
// intervention subject; the interventions consumer applies each agent's in
// order and delivers them. The reply comes once it is stored, so an
// accepted intervention is never lost. One too large to deliver is refused
// here, before anything is stored: found undeliverable later, it could
// only be given up.
func (o *Requests) Intervene(ctx context.Context, agentID string, req *interventions.InterventionRequest) (any, error) {
	iv := interventions.Intervention{ID: "iv_" + nuid.Next(), AgentID: agentID, Action: req.Action, Text: req.Text, At: o.now().UTC()}
	size, err := interventionDeliverySize(&iv)
	if err != nil {
		return nil, fmt.Errorf("waits: encode intervention: %w", err)
	}
	if limit := o.inbox.Room(); int64(size) > limit {
		return nil, &subjects.Error{Code: subjects.CodePayloadTooLarge, Message: fmt.Sprintf(
			"intervention text too large: its inbox delivery would be %d bytes, at most %d fit", size, limit)}
	}
	data, err := subjects.EncodeJSON(iv)
	if err != nil {
		return nil, fmt.Errorf("waits: encode intervention: %w", err)
	}
	m := &nats.Msg{Subject: subjects.InterventionApply(agentID), Data: data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, iv.ID)
	if _, err := o.js.PublishMsg(ctx, m); err != nil {
		return nil, fmt.Errorf("waits: store intervention: %w", err)
	}
	return map[string]any{"ok": true, "intervention_id": iv.ID}, nil
}
