package partitions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// MarkerKey is the key, in the first timers bucket, that records the
// sharded layout a store was made with. One token: it is no record key of
// either layout, and a replica of a version before partitions passes it
// over as such.
const MarkerKey = "layout"

// marker is MarkerKey's value.
type marker struct {
	Partitions int `json:"partitions"`
	Shards     int `json:"shards"`
}

// ErrMismatch is a configured layout other than the stored one.
var ErrMismatch = errors.New("the configured record layout is not the stored one")

// Check makes sure the records in timers and waits (each kind's first
// bucket) are in layout l, and records l in a store that has none yet.
// A store's layout is fixed when it first holds records: moving records
// between layouts is not built, so a replica configured otherwise
// refuses to start rather than not see them.
func Check(ctx context.Context, js jetstream.JetStream, l Layout, timers, waits jetstream.KeyValue) error {
	e, err := timers.Get(ctx, MarkerKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		if !l.Sharded() {
			return nil
		}
		for _, kv := range []jetstream.KeyValue{timers, waits} {
			n, err := unshardedRecords(ctx, js, kv)
			if err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("%w: CHIME_PARTITIONS=%d, but %s holds %d records of the unsharded layout; "+
					"moving them is not built yet: start with CHIME_PARTITIONS=0", ErrMismatch, l.Partitions, kv.Bucket(), n)
			}
		}
		b, _ := json.Marshal(marker(l))
		if _, err := timers.Create(ctx, MarkerKey, b); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("partitions: record the layout: %w", err)
		}
		return Check(ctx, js, l, timers, waits) // another replica may have won with another
	case err != nil:
		return fmt.Errorf("partitions: read the layout: %w", err)
	}
	var m marker
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return fmt.Errorf("partitions: the stored layout %q: %w", e.Value(), err)
	}
	if m.Partitions != l.Partitions || m.Shards != l.Shards {
		return fmt.Errorf("%w: the records are in %d partitions of %d shards (CHIME_PARTITIONS=%d, CHIME_SHARDS=%d), "+
			"not %d of %d; moving them is not built yet", ErrMismatch, m.Partitions, m.Shards, m.Partitions, m.Shards, l.Partitions, l.Shards)
	}
	return nil
}

// unshardedRecords counts the keys of kv of the unsharded layout
// (<agent>.<id>), removed ones' markers included.
func unshardedRecords(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) (int, error) {
	stream, err := js.Stream(ctx, "KV_"+kv.Bucket())
	if err != nil {
		return 0, fmt.Errorf("partitions: %s: %w", kv.Bucket(), err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter("$KV."+kv.Bucket()+".*.*"))
	if err != nil {
		return 0, fmt.Errorf("partitions: %s: %w", kv.Bucket(), err)
	}
	return len(info.State.Subjects), nil
}

// Stored is the layout recorded in timers (the first timers bucket): the
// unsharded layout when none is recorded.
func Stored(ctx context.Context, timers jetstream.KeyValue) (Layout, error) {
	e, err := timers.Get(ctx, MarkerKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Layout{}, nil
	}
	if err != nil {
		return Layout{}, fmt.Errorf("partitions: read the layout: %w", err)
	}
	var m marker
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return Layout{}, fmt.Errorf("partitions: the stored layout %q: %w", e.Value(), err)
	}
	return Layout(m), nil
}
