package kvrec_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/internal/kvrec"
)

// TestRetried: as an inbox fetch relies on, a read that fails transiently (no responders, an attempt
// unanswered in AttemptTimeout: a restart lost it) is sent again until it
// answers; any other failure, and the caller's own end, are returned at
// once.
func TestRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	calls := 0
	v, err := kvrec.Retried(ctx, func(actx context.Context) (int, error) {
		calls++
		switch calls {
		case 1:
			return 0, nats.ErrNoResponders
		case 2:
			<-actx.Done() // lost: only the attempt's own time ends it
			return 0, actx.Err()
		}
		return 7, nil
	})
	if v != 7 || err != nil || calls != 3 {
		t.Fatalf("transient failures: %d %v after %d calls", v, err, calls)
	}

	bad := errors.New("a bad request")
	calls = 0
	if _, err := kvrec.Retried(ctx, func(context.Context) (int, error) { calls++; return 0, bad }); !errors.Is(err, bad) || calls != 1 {
		t.Fatalf("a lasting failure: %v after %d calls", err, calls)
	}

	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	calls = 0
	if _, err := kvrec.Retried(short, func(context.Context) (int, error) { calls++; return 0, nats.ErrTimeout }); !errors.Is(err, nats.ErrTimeout) || short.Err() == nil || calls < 2 {
		t.Fatalf("until the deadline: %v after %d calls", err, calls)
	}
}
