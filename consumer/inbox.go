package consumer

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/subjects"
)

// Inbox is the one path by which an envelope reaches an agent's inbox:
// stored in the inbox stream under its stable ID (Nats-Msg-Id), so a
// repeat within the dedup window is stored once.
type Inbox struct {
	js jetstream.JetStream
}

// NewInbox returns the inbox path over js.
func NewInbox(js jetstream.JetStream) *Inbox { return &Inbox{js: js} }

// Deliver stores env in its agent's inbox and returns the stream's ack
// (Duplicate when the envelope was stored before).
func (i *Inbox) Deliver(ctx context.Context, env *subjects.Envelope) (*jetstream.PubAck, error) {
	m, err := env.Msg()
	if err != nil {
		return nil, err
	}
	ack, err := i.js.PublishMsg(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("deliver %s: %w", env.ID, err)
	}
	return ack, nil
}
