package deliveries

import (
	"context"
	"fmt"

	"github.com/chime-nats/chime/internal/directget"
)

// batchAfter reads up to max messages on subject after seq from the
// stream in one round trip, a batch direct get (nats-server 2.11+, a
// stream with AllowDirect), stopping before maxBytes of envelopes (but
// never before the first; deliverySize). A server without batch gets
// answers the first message alone, which is returned alone.
func (r *Reader) batchAfter(ctx context.Context, subject string, seq uint64, max, maxBytes int) ([]Delivery, error) {
	a, err := r.direct.Get(ctx, directget.Request{Seq: seq + 1, NextFor: subject, Batch: max, MaxBytes: maxBytes})
	if err != nil {
		return nil, err
	}
	out := make([]Delivery, 0, len(a.Msgs))
	size := 0
	for i := range a.Msgs {
		m := &a.Msgs[i]
		at, err := m.Time()
		if err != nil {
			return nil, fmt.Errorf("direct get: %w", err)
		}
		n := deliverySize(m.Data)
		if len(out) > 0 && size+n > maxBytes {
			// The server stops once it has sent maxBytes, with the
			// message that crosses it: that one waits for the next fetch.
			break
		}
		size += n
		out = append(out, Delivery{Seq: m.Seq, StoredAt: at, Envelope: m.Data})
	}
	return out, nil
}
