package storefull_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/storefull"
)

// TestOf tells the engine's answers about room from the rest, through
// either client's error type and any wrapping. The real answers are
// produced in the api and replica tests (a filled store, a bucket at its
// limit); here every code is pinned.
func TestOf(t *testing.T) {
	api := func(code int, errCode jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("nats: %w", &jetstream.APIError{Code: code, ErrorCode: errCode, Description: desc})
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"nil", nil, nil},
		{"server store full", api(503, 10023, "insufficient resources"), storefull.ErrStorageFull},
		{"server store full, legacy API", fmt.Errorf("kv: %w", &nats.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"}), storefull.ErrStorageFull},
		{"account store full", api(400, 10002, "resource limits exceeded for account"), storefull.ErrStorageFull},
		{"max bytes cannot be reserved", api(500, 10047, "insufficient storage resources available"), storefull.ErrStorageFull},
		{"disk full", api(503, 10077, "write /data/jetstream/x.blk: no space left on device"), storefull.ErrStorageFull},
		{"bucket at its limit", api(503, 10077, "maximum bytes exceeded"), storefull.ErrBucketFull},
		{"other store failure", api(503, 10077, "maximum messages per subject exceeded"), nil},
		{"leader election", api(503, 10008, "JetStream system temporarily unavailable"), nil},
		{"no responders", nats.ErrNoResponders, nil},
		{"already marked", fmt.Errorf("timers: %w", storefull.Mark("chime_timers", api(503, 10077, "maximum bytes exceeded"))), storefull.ErrBucketFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := storefull.Of(tc.err)
			if tc.want == nil && got != nil || tc.want != nil && !errors.Is(got, tc.want) {
				t.Fatalf("Of(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestMark names the bucket of a bucket at its limit, keeps the engine's
// answer, and leaves other errors alone.
func TestMark(t *testing.T) {
	engine := &jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum bytes exceeded"}
	err := storefull.Mark("chime_tasks", fmt.Errorf("nats: %w", engine))
	b, ok := errors.AsType[*storefull.BucketFullError](err)
	if !ok || b.Bucket != "chime_tasks" || !errors.Is(err, storefull.ErrBucketFull) || !errors.Is(err, engine) {
		t.Fatalf("Mark = %#v", err)
	}
	full := storefull.Mark("chime_tasks", &jetstream.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"})
	if !errors.Is(full, storefull.ErrStorageFull) || errors.Is(full, storefull.ErrBucketFull) {
		t.Fatalf("Mark of a full store = %v", full)
	}
	if err := storefull.Mark("chime_tasks", nats.ErrTimeout); err != nil {
		t.Fatalf("Mark of a timeout = %v, want nil", err)
	}
}
