package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/internal/metrictest"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
)

const (
	testStream  = "POOLTEST"
	testDurable = "pool-test"
)

// env is a server with a test stream, and a pool's registry.
type env struct {
	ns  *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	reg *prometheus.Registry
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ns := natstest.Server(t)
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: testStream, Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	return &env{ns: ns, nc: nc, js: js, reg: prometheus.NewRegistry()}
}

// start runs a pool over the test durable; adjust changes its config.
func (e *env) start(t *testing.T, cc jetstream.ConsumerConfig, adjust func(*consumer.PoolConfig), h consumer.Handler) *consumer.Pool {
	t.Helper()
	cc.Durable, cc.FilterSubject = testDurable, "t.>"
	cfg := consumer.PoolConfig{
		Name: testDurable, Workers: 4, Timeout: 5 * time.Second, NakDelay: 50 * time.Millisecond,
		Metrics: consumer.NewMetrics(e.reg),
		Create: func(ctx context.Context) (jetstream.Consumer, error) {
			return e.js.CreateOrUpdateConsumer(ctx, testStream, consumer.Redelivery(cc))
		},
	}
	if adjust != nil {
		adjust(&cfg)
	}
	p := consumer.NewPool(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), h)
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

func (e *env) publish(t *testing.T, subject, data string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := e.js.Publish(ctx, subject, []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// counter reads one series of a counter vector from the registry.
func (e *env) counter(t *testing.T, name string, labels map[string]string) float64 {
	return metrictest.Counter(t, e.reg, name, labels)
}

func terminated(reason string) map[string]string {
	return map[string]string{"consumer": testDurable, "reason": reason}
}

func TestRedeliveryConfig(t *testing.T) {
	c := consumer.Redelivery(jetstream.ConsumerConfig{Durable: "x"})
	want := []time.Duration{consumer.DefaultAckWait, 4 * time.Second, 8 * time.Second, 15 * time.Second, 30 * time.Second}
	if c.AckPolicy != jetstream.AckExplicitPolicy || c.AckWait != consumer.DefaultAckWait ||
		c.MaxDeliver != consumer.DefaultMaxDeliver || fmt.Sprint(c.BackOff) != fmt.Sprint(want) {
		t.Errorf("defaults: %+v", c)
	}
	c = consumer.Redelivery(jetstream.ConsumerConfig{AckWait: 250 * time.Millisecond, MaxDeliver: 3})
	if c.AckWait != 250*time.Millisecond || c.MaxDeliver != 3 || fmt.Sprint(c.BackOff) != fmt.Sprint([]time.Duration{250 * time.Millisecond, 4 * time.Second, 8 * time.Second}) {
		t.Errorf("short: %+v", c)
	}
	c = consumer.Redelivery(jetstream.ConsumerConfig{AckWait: 10 * time.Second})
	if fmt.Sprint(c.BackOff) != fmt.Sprint([]time.Duration{10 * time.Second, 15 * time.Second, 30 * time.Second}) {
		t.Errorf("long: %+v", c.BackOff)
	}
}

func TestMetricsSharedPerRegisterer(t *testing.T) {
	reg := prometheus.NewRegistry()
	consumer.NewMetrics(reg)
	consumer.NewMetrics(reg) // a second feature on the same registerer
	consumer.NewMetrics(nil)
}

// TestPoolRecoversPanic: a handler that panics is recovered into a Nak,
// logged and counted, and its message comes again.
func TestPoolRecoversPanic(t *testing.T) {
	e := newEnv(t)
	var calls atomic.Int32
	done := make(chan uint64, 1)
	e.start(t, jetstream.ConsumerConfig{}, nil, func(_ context.Context, d *consumer.Delivery) error {
		calls.Add(1)
		if d.Delivered == 1 {
			panic("boom")
		}
		done <- d.Delivered
		return nil
	})
	start := time.Now()
	e.publish(t, "t.a", "x")
	select {
	case n := <-done:
		if n != 2 {
			t.Fatalf("handled on delivery %d", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not redelivered after the panic")
	}
	t.Logf("redelivered %v after a panic", time.Since(start).Round(time.Millisecond))
	if got := e.counter(t, "chime_consumer_handler_panics_total", map[string]string{"consumer": testDurable}); got != 1 {
		t.Errorf("panics = %v", got)
	}
	if got := e.counter(t, "chime_consumer_terminated_total", terminated(consumer.ReasonPanic)); got != 0 {
		t.Errorf("terminated for panic = %v", got)
	}
}

// TestPoolTerminates: poison is terminated at once; a message that keeps
// failing or panicking is terminated on its last delivery; each counted.
func TestPoolTerminates(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	seen := map[string][]uint64{} // deliveries, each once
	attempts := map[string]int{}  // handler calls
	e.start(t, jetstream.ConsumerConfig{AckWait: 500 * time.Millisecond, MaxDeliver: 2}, func(c *consumer.PoolConfig) {
		c.WaitFor = 200 * time.Millisecond
	}, func(_ context.Context, d *consumer.Delivery) error {
		mu.Lock()
		if d.Attempt == 1 {
			seen[d.Subject] = append(seen[d.Subject], d.Delivered)
		}
		attempts[d.Subject]++
		mu.Unlock()
		switch d.Subject {
		case "t.poison":
			return fmt.Errorf("%w: garbage", consumer.ErrPoison)
		case "t.fail":
			return errors.New("store unavailable")
		case "t.later":
			return consumer.ErrNotYet
		case "t.panic":
			panic("always")
		}
		return nil
	})
	for _, s := range []string{"t.poison", "t.fail", "t.later", "t.panic", "t.ok"} {
		e.publish(t, s, "x")
	}
	testwait.Eventually(t, 5*time.Second, func() bool {
		return e.counter(t, "chime_consumer_terminated_total", terminated(consumer.ReasonPoison)) == 1 &&
			e.counter(t, "chime_consumer_terminated_total", terminated(consumer.ReasonMaxDeliver)) == 2 &&
			e.counter(t, "chime_consumer_terminated_total", terminated(consumer.ReasonPanic)) == 1
	}, "terminations counted")
	mu.Lock()
	defer mu.Unlock()
	for s, want := range map[string]string{"t.poison": "[1]", "t.fail": "[1 2]", "t.later": "[1 2]", "t.panic": "[1 2]", "t.ok": "[1]"} {
		if got := fmt.Sprint(seen[s]); got != want {
			t.Errorf("%s delivered %s, want %s", s, got, want)
		}
	}
	// ErrNotYet is retried locally (every NakDelay for WaitFor) before
	// each nak: more calls than deliveries.
	if attempts["t.later"] < 4 {
		t.Errorf("t.later called %d times", attempts["t.later"])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	testwait.Eventually(t, 3*time.Second, func() bool {
		c, err := e.js.Consumer(ctx, testStream, testDurable)
		return err == nil && c.CachedInfo().NumAckPending == 0 && c.CachedInfo().NumPending == 0
	}, "nothing pending")
}

// TestPoolKeepsSlowMessage: a handler working for several AckWaits is not
// raced by a redelivery of its message.
func TestPoolKeepsSlowMessage(t *testing.T) {
	e := newEnv(t)
	var deliveries atomic.Int32
	done := make(chan struct{}, 4)
	e.start(t, jetstream.ConsumerConfig{AckWait: 300 * time.Millisecond}, nil, func(ctx context.Context, d *consumer.Delivery) error {
		deliveries.Add(1)
		select {
		case <-time.After(1200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		done <- struct{}{}
		return nil
	})
	e.publish(t, "t.slow", "x")
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("slow message not handled")
	}
	time.Sleep(500 * time.Millisecond)
	if n := deliveries.Load(); n != 1 {
		t.Fatalf("delivered %d times", n)
	}
}

// TestPoolRecreatesDeletedConsumer: the durable deleted under a running
// pool is re-created, and consuming goes on.
func TestPoolRecreatesDeletedConsumer(t *testing.T) {
	e := newEnv(t)
	got := make(chan string, 16)
	e.start(t, jetstream.ConsumerConfig{}, nil, func(_ context.Context, d *consumer.Delivery) error {
		got <- string(d.Data)
		return nil
	})
	wait := func(want string) {
		t.Helper()
		deadline := time.After(8 * time.Second)
		for {
			select {
			case s := <-got:
				if s == want {
					return
				}
			case <-deadline:
				t.Fatalf("%s not consumed", want)
			}
		}
	}
	e.publish(t, "t.a", "before")
	wait("before")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.js.DeleteConsumer(ctx, testStream, testDurable); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	e.publish(t, "t.a", "after")
	wait("after")
	t.Logf("consuming again %v after the delete", time.Since(deleted).Round(time.Millisecond))
	if n := e.counter(t, "chime_consumer_recreated_total", map[string]string{"consumer": testDurable}); n < 1 {
		t.Errorf("recreated = %v", n)
	}
	if _, err := e.js.Consumer(ctx, testStream, testDurable); err != nil {
		t.Errorf("durable not re-created: %v", err)
	}
}

// TestPoolStopBounded: Stop returns in bounded time with the server gone
// and a handler in flight, and is idempotent; nil and never-started pools
// stop too.
func TestPoolStopBounded(t *testing.T) {
	e := newEnv(t)
	inFlight := make(chan struct{})
	p := e.start(t, jetstream.ConsumerConfig{}, func(c *consumer.PoolConfig) {
		c.DrainTimeout = 300 * time.Millisecond
		c.Timeout = time.Minute
	}, func(ctx context.Context, d *consumer.Delivery) error {
		close(inFlight)
		<-ctx.Done()
		return ctx.Err()
	})
	e.publish(t, "t.a", "x")
	<-inFlight
	e.ns.Shutdown()
	start := time.Now()
	p.Stop(context.Background())
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Stop took %v", took)
	} else {
		t.Logf("stopped in %v with the server gone", took.Round(time.Millisecond))
	}
	p.Stop(context.Background())
	var never *consumer.Pool
	never.Stop(context.Background())
	(&consumer.Pool{}).Stop(context.Background())
}
