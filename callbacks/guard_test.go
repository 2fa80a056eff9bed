package callbacks

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/natstest"
)

// guardStore returns a Store whose only use is the lifecycle guard, on a
// leases bucket of a real server whose keys expire after ttl.
func guardStore(t *testing.T, ttl time.Duration) (*Store, jetstream.KeyValue) {
	t.Helper()
	js := natstest.JetStream(t, natstest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "guard_test", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return &Store{leases: kv}, kv
}

// TestGuardHoldsPastItsTTL: work that runs for several TTLs keeps the
// guard, and a second taker is refused the whole time; once the work is
// done the guard is free at once.
func TestGuardHoldsPastItsTTL(t *testing.T) {
	const ttl = time.Second
	s, _ := guardStore(t, ttl)
	ctx := context.Background()
	err := s.guarded(ctx, "a", func(wctx context.Context) error {
		start := time.Now()
		for time.Since(start) < 3*ttl {
			// The second taker gives up after 200 ms; it must never get in.
			tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			err := s.guarded(tctx, "a", func(context.Context) error { return nil })
			cancel()
			if err == nil {
				t.Errorf("a second taker got the guard %v into the work; TTL %v", time.Since(start), ttl)
				return nil
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("second taker: %v", err)
			}
			if wctx.Err() != nil {
				t.Errorf("work's context ended: %v", context.Cause(wctx))
				return nil
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := s.guarded(tctx, "a", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("guard not freed after the work: %v", err)
	}
}

// TestGuardLostStopsTheWork: when the key is taken from the holder
// (deleted, or overwritten by another), the work's context ends with
// ErrGuardLost, and so does the guarded call.
func TestGuardLostStopsTheWork(t *testing.T) {
	for name, steal := range map[string]func(context.Context, jetstream.KeyValue) error{
		"deleted": func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Delete(ctx, "lifecycle.a") },
		"overwritten": func(ctx context.Context, kv jetstream.KeyValue) error {
			_, err := kv.Put(ctx, "lifecycle.a", []byte("other"))
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, kv := guardStore(t, time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var cause error
			err := s.guarded(ctx, "a", func(wctx context.Context) error {
				if err := steal(ctx, kv); err != nil {
					t.Fatal(err)
				}
				<-wctx.Done()
				cause = context.Cause(wctx)
				return wctx.Err()
			})
			if !errors.Is(cause, ErrGuardLost) {
				t.Errorf("work's context ended with %v, want ErrGuardLost", cause)
			}
			if !errors.Is(err, ErrGuardLost) {
				t.Errorf("guarded returned %v, want ErrGuardLost", err)
			}
		})
	}
}
