package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/replica"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

// chimeURL is the NATS address of the chime the examples talk to: a whole
// replica with its embedded server, started by TestMain.
var chimeURL string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "chime-client-example")
	if err != nil {
		panic(err)
	}
	cfg := &config.Config{
		DataDir: dir, NATSListen: "127.0.0.1:-1", JSReplicas: 1, ReplicaID: "example", Shards: 4,
		LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, LogLevel: "info", LogFormat: "text",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	r, err := replica.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), "0.0.0-example")
	cancel()
	if err != nil {
		panic(err)
	}
	chimeURL = r.NATSURL()
	code := m.Run()
	r.Stop(context.Background())
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// An agent waits two seconds, watching the progress chime sends about once
// a second, and continues with the completion text.
func ExampleClient_Wait() {
	nc, err := nats.Connect(chimeURL)
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	agent, _ := client.New(nc, "researcher")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var headings []string
	res, err := agent.Wait(ctx, client.WaitRequest{
		Seconds:  2,
		Progress: func(p waits.WaitProgress) { headings = append(headings, p.Heading) },
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(len(headings) > 0 && strings.HasPrefix(headings[0], "icon://timer Wait: ") && strings.HasSuffix(headings[0], "s remaining"))
	fmt.Println(res.Text == "Wait complete. Reached "+res.TargetTime+".")
	// Output:
	// true
	// true
}

// An operator's message cuts a long wait short; the agent gets the text.
func ExampleClient_Wait_intervention() {
	nc, err := nats.Connect(chimeURL)
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	agent, _ := client.New(nc, "deployer")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = agent.Wait(ctx, client.WaitRequest{
		Hours: 1,
		Started: func(waits.WaitReply) {
			// The operator, elsewhere, once the wait is registered.
			go func() { _ = agent.Intervene(ctx, "message", "Stop waiting: the deploy failed.") }()
		},
	})
	var iv *client.InterventionError
	if errors.Is(err, client.ErrIntervention) && errors.As(err, &iv) {
		fmt.Println("intervention:", iv.Text)
	}
	// Output: intervention: Stop waiting: the deploy failed.
}

// A timer reminds the agent later, through its inbox, while it keeps working.
func ExampleClient_CreateTimer() {
	nc, err := nats.Connect(chimeURL)
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	agent, _ := client.New(nc, "builder")

	fired := make(chan subjects.Envelope, 1)
	sub, err := agent.SubscribeInbox(func(env subjects.Envelope) { fired <- env })
	if err != nil {
		panic(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = nc.Flush()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	timer, err := agent.CreateTimer(ctx, 200, 0, "check the build")
	if err != nil {
		panic(err)
	}
	fmt.Println(timer.Status)
	env := <-fired
	fmt.Println(env.Kind, env.Text)
	// Output:
	// active
	// timer_fired check the build
}

// Errors carry chime's codes: match them with errors.Is.
func ExampleClient_GetTimer() {
	nc, err := nats.Connect(chimeURL)
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	agent, _ := client.New(nc, "builder")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = agent.GetTimer(ctx, "no-such-timer")
	fmt.Println(errors.Is(err, subjects.ErrTimerNotFound), err)
	// Output: true timer_not_found: timer no-such-timer not found
}

// An agent reads its inbox reliably: it fetches what it has not acked,
// handles it, and acks; what it acked never comes again.
func ExampleClient_FetchInbox() {
	nc, err := nats.Connect(chimeURL)
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	c, _ := client.New(nc, "reader")
	ctx := context.Background()
	if _, err := c.CreateTimer(ctx, 10, 0, "check the build"); err != nil {
		panic(err)
	}
	got, err := c.FetchInbox(ctx, 10, 5*time.Second) // waits for the fire
	if err != nil {
		panic(err)
	}
	for _, d := range got.Deliveries {
		var env subjects.Envelope
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			panic(err)
		}
		fmt.Println(env.Kind, env.Text)
		if _, err := c.AckInbox(ctx, d.Seq); err != nil {
			panic(err)
		}
	}
	again, err := c.FetchInbox(ctx, 10, 0)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(again.Deliveries), "left")
	// Output:
	// timer_fired check the build
	// 0 left
}
