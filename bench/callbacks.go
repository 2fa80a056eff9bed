package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/subjects"
)

// CallbacksOptions configures a callback benchmark.
type CallbacksOptions struct {
	N     int // enqueue callbacks to send
	Conns int // concurrent HTTP connections
	Wakes int // wakes sent one at a time for wake-to-inbox latency
	// Auth runs the in-process chime with NATS authorization on; the
	// bench connects as an operator.
	Auth    bool
	NATSURL string
	// Token connects to NATSURL (CHIME_NATS_TOKEN): an operator's where
	// NATS authorization is on.
	Token string
	// NATS sends the callbacks as NATS requests (callback.enqueue,
	// callback.wake, the trigger's token in the header) from connections
	// that present the trigger's token, as a callback sender does, instead
	// of HTTP POSTs.
	NATS bool
	Log  *slog.Logger
}

// Validate checks the options.
func (o *CallbacksOptions) Validate() error {
	switch {
	case o.N <= 0:
		return errors.New("bench: -n must be positive")
	case o.Conns <= 0:
		return errors.New("bench: -c must be positive")
	case o.Wakes < 0:
		return errors.New("bench: --wakes must not be negative")
	}
	return nil
}

// CallbacksResult is what a callback benchmark measured.
type CallbacksResult struct {
	N            int     `json:"n"`
	Conns        int     `json:"conns"`
	Via          string  `json:"via"` // http or nats
	RequestsPerS float64 `json:"requests_per_s"`
	// LatencyMs is the HTTP round trip of an enqueue: stored in JetStream
	// when it returns.
	LatencyMs Latency `json:"latency_ms"`
	Errors    int     `json:"errors"`
	Delivered int     `json:"delivered"`
	Missed    int     `json:"missed"`
	// WakeToInboxMs is a wake POST's send to its wake_hint at the
	// agent's subscriber.
	WakeToInboxMs Latency `json:"wake_to_inbox_ms"`
	PeakRSSBytes  int64   `json:"peak_rss_bytes"`
}

// Callbacks runs the benchmark: N enqueues over HTTP from Conns
// connections, then Wakes wakes one after another.
func Callbacks(ctx context.Context, o CallbacksOptions) (*CallbacksResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	url, auth, stop, err := target(ctx, o.NATSURL, o.Token, o.Auth, o.Log)
	if err != nil {
		return nil, err
	}
	defer stop()
	nc, err := nats.Connect(url, append(auth, nats.Name("chime-bench"))...)
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer nc.Close()
	agent := fmt.Sprintf("cb%d", time.Now().UnixNano()%1e9)
	c, err := client.New(nc, agent)
	if err != nil {
		return nil, err
	}
	started, err := c.Start(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench: agent start: %w", err)
	}
	defer func() { _, _ = c.Stop(context.Background()) }()
	httpc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		MaxIdleConns: o.Conns, MaxIdleConnsPerHost: o.Conns, MaxConnsPerHost: o.Conns,
	}}
	defer httpc.CloseIdleConnections()
	urls := map[callbacks.DeliveryMode]string{}
	triggers := map[callbacks.DeliveryMode]callbacks.TriggerView{}
	for _, tr := range started.Triggers {
		urls[tr.Mode] = tr.TriggerURL
		triggers[tr.Mode] = tr
	}
	send := func(ctx context.Context, i int, mode callbacks.DeliveryMode, contentType, body string) error {
		return postCallback(ctx, httpc, urls[mode], contentType, body)
	}
	if o.NATS {
		senders, err := callbackSenders(url, triggers, min(o.Conns, 4))
		if err != nil {
			return nil, err
		}
		defer closeAll(senders[callbacks.ModeWakeHint])
		defer closeAll(senders[callbacks.ModeEnqueueMessage])
		send = func(ctx context.Context, i int, mode callbacks.DeliveryMode, contentType, body string) error {
			conns := senders[mode]
			return requestCallback(ctx, conns[i%len(conns)], mode, triggerToken(triggers[mode]), contentType, body)
		}
	}

	// The agent's subscriber: counts messages, times wake hints.
	var delivered atomic.Int64
	wakes := make(chan time.Time, 1)
	sub, err := nc.Subscribe(subjects.Inbox(agent), func(m *nats.Msg) {
		switch m.Header.Get(subjects.HeaderKind) {
		case subjects.KindMessage:
			delivered.Add(1)
		case subjects.KindWakeHint:
			wakes <- time.Now()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("bench: subscribe: %w", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		return nil, fmt.Errorf("bench: flush: %w", err)
	}

	res := &CallbacksResult{N: o.N, Conns: o.Conns, Via: "http"}
	if o.NATS {
		res.Via = "nats"
	}
	lat := make([]time.Duration, o.N)
	var errs atomic.Int64
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for w := range o.Conns {
		g.Go(func() error {
			for i := w; i < o.N; i += o.Conns {
				t0 := time.Now()
				if err := send(gctx, w, callbacks.ModeEnqueueMessage, "text/plain", "bench "+strconv.Itoa(i)); err != nil {
					if gctx.Err() != nil {
						return gctx.Err()
					}
					errs.Add(1)
				}
				lat[i] = time.Since(t0)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	res.RequestsPerS = float64(o.N) / time.Since(start).Seconds()
	res.LatencyMs = summarize(lat)
	res.Errors = int(errs.Load())
	deadline := time.Now().Add(10 * time.Second)
	for delivered.Load() < int64(o.N-res.Errors) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	res.Delivered = int(delivered.Load())
	res.Missed = o.N - res.Errors - res.Delivered

	// One wake at a time, each waiting for its hint, so none coalesce.
	wl := make([]time.Duration, 0, o.Wakes)
	for i := range o.Wakes {
		t0 := time.Now()
		if err := send(ctx, i, callbacks.ModeWakeHint, "", ""); err != nil {
			return nil, fmt.Errorf("bench: wake: %w", err)
		}
		select {
		case at := <-wakes:
			wl = append(wl, at.Sub(t0))
		case <-time.After(5 * time.Second):
			return nil, errors.New("bench: a wake hint did not arrive within 5s")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	res.WakeToInboxMs = summarize(wl)
	res.PeakRSSBytes = peakRSS()
	return res, nil
}

// postCallback posts one callback and wants 200 with a stored result
// (triggered or enqueued).
func postCallback(ctx context.Context, c *http.Client, url, contentType, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := c.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var reply callbacks.CallbackReply
	if res.StatusCode != http.StatusOK || json.Unmarshal(b, &reply) != nil || reply.Result.Disposition != reply.Result.Mode.Accepted() {
		return fmt.Errorf("callback: %d %s", res.StatusCode, strings.TrimSpace(string(b)))
	}
	return nil
}

// triggerToken is the token at the end of a trigger's URL.
func triggerToken(t callbacks.TriggerView) string {
	return t.TriggerURL[strings.LastIndex(t.TriggerURL, "/")+1:]
}

// callbackSenders connects n times for each trigger, presenting its token
// and using its inbox prefix, as a callback sender over NATS does.
func callbackSenders(url string, triggers map[callbacks.DeliveryMode]callbacks.TriggerView, n int) (map[callbacks.DeliveryMode][]*nats.Conn, error) {
	senders := map[callbacks.DeliveryMode][]*nats.Conn{}
	for mode, t := range triggers {
		for range n {
			nc, err := nats.Connect(url, nats.Token(triggerToken(t)), nats.CustomInboxPrefix(access.Principal{Kind: access.KindCallback, TriggerID: t.ID}.InboxPrefix()), nats.Name("chime-bench callback"))
			if err != nil {
				for _, conns := range senders {
					closeAll(conns)
				}
				return nil, fmt.Errorf("bench: connect as the %s trigger: %w", mode, err)
			}
			senders[mode] = append(senders[mode], nc)
		}
	}
	return senders, nil
}

// requestCallback sends one callback as a NATS request and wants a stored
// result (triggered or enqueued).
func requestCallback(ctx context.Context, nc *nats.Conn, mode callbacks.DeliveryMode, token, contentType, body string) error {
	subject := subjects.CallbackWake
	if mode == callbacks.ModeEnqueueMessage {
		subject = subjects.CallbackEnqueue
	}
	m := nats.NewMsg(subject)
	m.Header.Set(subjects.HeaderCallbackToken, token)
	if contentType != "" {
		m.Header.Set(subjects.HeaderContentType, contentType)
	}
	m.Data = []byte(body)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return err
	}
	var reply callbacks.CallbackReply
	if err := subjects.DecodeReply(res.Data, &reply); err != nil {
		return fmt.Errorf("callback: %w", err)
	}
	if reply.Result.Disposition != reply.Result.Mode.Accepted() {
		return fmt.Errorf("callback: %s", strings.TrimSpace(string(res.Data)))
	}
	return nil
}

// WriteText prints a result for people.
func (r *CallbacksResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "callbacks: n=%d conns=%d via %s\n", r.N, r.Conns, r.Via)
	fmt.Fprintf(w, "enqueue requests/s: %.0f\n", r.RequestsPerS)
	fmt.Fprintf(w, "enqueue latency ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", r.LatencyMs.P50, r.LatencyMs.P90, r.LatencyMs.P99, r.LatencyMs.Max)
	fmt.Fprintf(w, "errors: %d  delivered: %d  missed: %d\n", r.Errors, r.Delivered, r.Missed)
	fmt.Fprintf(w, "wake to inbox ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", r.WakeToInboxMs.P50, r.WakeToInboxMs.P90, r.WakeToInboxMs.P99, r.WakeToInboxMs.Max)
	fmt.Fprintf(w, "peak rss: %.1f MiB\n", float64(r.PeakRSSBytes)/(1<<20))
}
