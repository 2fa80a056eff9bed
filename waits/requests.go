package waits

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/chime-nats/chime/consumer"
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
// wait_cancelled envelope, and returns the record. Cancelling an ended wait
// returns it unchanged.
func (o *Requests) Cancel(ctx context.Context, agentID, waitID string) (*subjects.Wait, error) {
	w, ended, err := o.store.Cancel(ctx, agentID, waitID, subjects.CancelByRequest, "Wait cancelled.")
	if err != nil || !ended {
		return w, err
	}
	env := subjects.WaitEndEnvelope(w, w.CancelText, o.now())
	if _, err := o.inbox.Deliver(ctx, &env); err != nil {
		// The wait is cancelled; only its delivery is missing. A retry of
		// the cancel finds it ended and the caller has the record.
		o.log.Warn("wait cancelled but its delivery failed", "wait_id", waitID, "err", err)
	}
	return w, nil
}

// Intervene stores the intervention as an event; the interventions
// consumer applies it, in order, and delivers it. The reply comes once it
// is stored, so an accepted intervention is never lost.
func (o *Requests) Intervene(ctx context.Context, agentID string, req *subjects.InterventionRequest) (any, error) {
	iv := subjects.Intervention{ID: "iv_" + nuid.Next(), AgentID: agentID, Action: req.Action, Text: req.Text, At: o.now().UTC()}
	data, err := json.Marshal(iv)
	if err != nil {
		return nil, fmt.Errorf("waits: encode intervention: %w", err)
	}
	m := &nats.Msg{Subject: subjects.InterventionApply, Data: data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, iv.ID)
	if _, err := o.js.PublishMsg(ctx, m); err != nil {
		return nil, fmt.Errorf("waits: store intervention: %w", err)
	}
	return map[string]any{"ok": true, "intervention_id": iv.ID}, nil
}
