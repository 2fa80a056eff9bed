package bench

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestAuthorizedTarget drives a chime with NATS authorization on through
// its URL and an operator token, as against `chime serve`: timers created
// by agents with tokens of their own, callbacks over NATS from the
// trigger's token, and connects through the auth callout. Every request
// must be answered (none refused by a permission or the reply check); the
// figures are not checked.
func TestAuthorizedTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a chime")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	r, token, stop, err := local(ctx, true, log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	url := r.NATSURL()

	tm, err := Timers(ctx, TimersOptions{N: 200, Clients: 4, Lead: time.Second, NATSURL: url, Token: token, AgentTokens: true, Log: log})
	if err != nil {
		t.Fatalf("timers as agents: %v", err)
	}
	if tm.Missed != 0 || !tm.AgentTokens {
		t.Fatalf("timers as agents: %+v", tm)
	}

	for _, viaNATS := range []bool{false, true} {
		cb, err := Callbacks(ctx, CallbacksOptions{N: 200, Conns: 8, Wakes: 10, NATSURL: url, Token: token, NATS: viaNATS, Log: log})
		if err != nil {
			t.Fatalf("callbacks (nats %v): %v", viaNATS, err)
		}
		if cb.Errors != 0 || cb.Delivered != 200 {
			t.Fatalf("callbacks (nats %v): %+v", viaNATS, cb)
		}
	}

	for _, as := range []string{"agent", "operator"} {
		cn, err := Connect(ctx, ConnectOptions{N: 50, Clients: 4, As: as, NATSURL: url, Token: token, Log: log})
		if err != nil {
			t.Fatalf("connect as %s: %v", as, err)
		}
		if err := cn.Err(); err != nil || cn.As != as || cn.LatencyMs.Max <= 0 {
			t.Fatalf("connect as %s: %+v %v", as, cn, err)
		}
	}
}

// TestAuthorizedRefusals: a token is for CHIME_NATS_URL, an agent's token
// is issued only by an operator, and a wrong token is refused at connect.
func TestAuthorizedRefusals(t *testing.T) {
	for _, c := range []struct {
		name string
		err  func() error
		want string
	}{
		{"token without url", func() error {
			_, err := Timers(context.Background(), TimersOptions{N: 1, Clients: 1, Token: "x"})
			return err
		}, "CHIME_NATS_URL"},
		{"agent tokens without an operator", func() error {
			o := TimersOptions{N: 1, Clients: 1, NATSURL: "nats://127.0.0.1:1", AgentTokens: true}
			return o.Validate()
		}, "--agent-tokens"},
		{"connect without a token", func() error {
			o := ConnectOptions{N: 1, Clients: 1, As: "agent", NATSURL: "nats://127.0.0.1:1"}
			return o.Validate()
		}, "CHIME_NATS_TOKEN"},
		{"connect as nobody", func() error {
			o := ConnectOptions{N: 1, Clients: 1, As: "callback"}
			return o.Validate()
		}, "--as"},
	} {
		err := c.err()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.want)
		}
	}

	if testing.Short() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	r, _, stop, err := local(ctx, true, log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	_, err = Connect(ctx, ConnectOptions{N: 1, Clients: 1, As: "operator", NATSURL: r.NATSURL(), Token: "bench_op_wrong", Log: log})
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("a wrong operator token: %v, want an authorization violation", err)
	}
}
