package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/notifications"
)

// NotifyOptions configures a notification benchmark.
type NotifyOptions struct {
	Rate     float64       // notifications sent per second
	Duration time.Duration // how long they are sent
	Agents   int           // agents they are spread over
	Clients  int           // SSE clients of the all-agents stream
	// InFlight bounds the notify requests awaiting their reply.
	InFlight int
	// Prefill starts the measure at steady state: before it, each agent
	// is sent Limit notifications (full), then 2×Limit more plus a share
	// of Limit that grows with the agent's index (every notify evicts the
	// oldest, and the agents' removal markers are at every stage between
	// two compactions, as after a long run).
	Prefill bool
	// Limit is the chime's CHIME_NOTIFICATIONS_MAX, for Prefill.
	Limit   int
	NATSURL string
	// HTTPURL is the gateway of the chime at NATSURL (both or neither).
	HTTPURL string
	Log     *slog.Logger
}

// Validate checks the options.
func (o *NotifyOptions) Validate() error {
	switch {
	case o.Rate <= 0:
		return errors.New("bench: --rate must be positive")
	case o.Duration <= 0:
		return errors.New("bench: --duration must be positive")
	case o.Agents <= 0:
		return errors.New("bench: --agents must be positive")
	case o.Clients <= 0:
		return errors.New("bench: --clients must be positive")
	case o.InFlight <= 0:
		return errors.New("bench: --in-flight must be positive")
	case o.Prefill && o.Limit <= 0:
		return errors.New("bench: --limit must be positive")
	case (o.NATSURL == "") != (o.HTTPURL == ""):
		return errors.New("bench: an existing chime needs both CHIME_NATS_URL and --http")
	}
	return nil
}

// NotifyResult is what a notification benchmark measured.
type NotifyResult struct {
	N       int     `json:"n"`
	Agents  int     `json:"agents"`
	Clients int     `json:"sse_clients"`
	Rate    float64 `json:"rate"`
	// Prefilled is how many notifications were sent before the measure
	// (see NotifyOptions.Prefill), and PrefillS how long they took.
	Prefilled int     `json:"prefilled,omitempty"`
	PrefillS  float64 `json:"prefill_s,omitempty"`
	// SentPerS: notify requests answered per second, first sent to last
	// answered.
	SentPerS float64 `json:"sent_per_s"`
	// ReplyMs: notify request to its reply.
	ReplyMs Latency `json:"reply_ms"`
	// DeliveryMs: a notify request sent to its upsert read by an SSE
	// client, over every client.
	DeliveryMs Latency `json:"publish_to_sse_ms"`
	// EventsPerS: upserts read per second by all the clients together.
	EventsPerS   float64 `json:"sse_events_per_s"`
	Missed       int     `json:"missed"`
	Duplicates   int     `json:"duplicates"`
	Failed       int     `json:"failed"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
}

// Notify runs the benchmark: Clients SSE streams of every agent's
// notifications over HTTP, then notifications sent at Rate for Duration,
// spread over Agents; each client times each notification from its
// request to its upsert on the stream.
func Notify(ctx context.Context, o NotifyOptions) (*NotifyResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	natsURL, httpURL := o.NATSURL, o.HTTPURL
	if natsURL == "" {
		r, _, stop, err := local(ctx, false, o.Log)
		if err != nil {
			return nil, err
		}
		defer stop()
		natsURL, httpURL = r.NATSURL(), "http://"+r.HTTPAddr()
	}
	nc, err := nats.Connect(natsURL, nats.Name("chime-bench"))
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer nc.Close()
	run := fmt.Sprintf("nb%d", time.Now().UnixNano()%1e9)
	n := int(o.Rate * o.Duration.Seconds())
	sent := make([]atomic.Int64, n) // unix ns each request went out; 0: not yet

	clients := make([]*client.Client, o.Agents)
	for i := range clients {
		if clients[i], err = client.New(nc, fmt.Sprintf("%s-%d", run, i)); err != nil {
			return nil, err
		}
	}
	var prefilled int
	var prefillFor time.Duration
	if o.Prefill {
		t0 := time.Now()
		if prefilled, err = prefill(ctx, clients, o.Limit, o.InFlight); err != nil {
			return nil, err
		}
		prefillFor = time.Since(t0)
	}

	// The streams start live, after the prefill: only the measured
	// notifications are timed.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	streams := make([]*sseClient, o.Clients)
	var wg sync.WaitGroup
	for i := range streams {
		s, err := openStream(sctx, httpURL+"/api/notifications/events", run, sent)
		if err != nil {
			return nil, err
		}
		streams[i] = s
		wg.Go(s.read)
	}
	defer wg.Wait()
	defer cancel()

	var mu sync.Mutex
	var replies []time.Duration
	failed := 0
	sem := make(chan struct{}, o.InFlight)
	start := time.Now()
	var sends sync.WaitGroup
	for i := range n {
		at := start.Add(time.Duration(float64(i) / o.Rate * float64(time.Second)))
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		sem <- struct{}{}
		sends.Go(func() {
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			t0 := time.Now()
			sent[i].Store(t0.UnixNano())
			_, err := clients[i%o.Agents].Notify(rctx, client.Notification{Message: "b" + strconv.Itoa(i), Type: notifications.NotifyProgress})
			took := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				o.Log.Warn("notify failed", "err", err)
				return
			}
			replies = append(replies, took)
		})
	}
	sends.Wait()
	sentFor := time.Since(start)
	// Let the streams catch up with the last ones.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		behind := false
		for _, s := range streams {
			if s.count() < n-failed {
				behind = true
			}
		}
		if !behind {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	res := &NotifyResult{
		N: n, Agents: o.Agents, Clients: o.Clients, Rate: o.Rate, Failed: failed, ReplyMs: summarize(replies),
		Prefilled: prefilled, PrefillS: prefillFor.Seconds(),
	}
	res.SentPerS = float64(len(replies)) / sentFor.Seconds()
	var all []time.Duration
	var first, last time.Time
	for _, s := range streams {
		all = append(all, s.latency...)
		res.Duplicates += s.dups
		res.Missed += n - failed - len(s.latency)
		if first.IsZero() || s.first.Before(first) {
			first = s.first
		}
		if s.last.After(last) {
			last = s.last
		}
	}
	res.DeliveryMs = summarize(all)
	if span := last.Sub(first).Seconds(); span > 0 {
		res.EventsPerS = float64(len(all)) / span
	}
	res.PeakRSSBytes = peakRSS()
	return res, nil
}

// prefill sends each agent limit notifications, then 2×limit more and
// i×limit/len(clients) for the i-th (see NotifyOptions.Prefill), as fast
// as inFlight requests at once allow, and returns how many it sent.
func prefill(ctx context.Context, clients []*client.Client, limit, inFlight int) (int, error) {
	type job struct{ agent, k int }
	jobs := make(chan job)
	errs := make(chan error, inFlight)
	var wg sync.WaitGroup
	for range min(inFlight, 64) {
		wg.Go(func() {
			for j := range jobs {
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := clients[j.agent].Notify(rctx, client.Notification{Message: "prefill " + strconv.Itoa(j.k), Type: notifications.NotifyProgress})
				cancel()
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	sent := 0
	// Round after round over the agents, as the measure sends.
	total := func(i int) int { return 3*limit + i*limit/len(clients) }
feed:
	for k := range total(len(clients) - 1) {
		for i := range clients {
			if k >= total(i) {
				continue
			}
			select {
			case jobs <- job{i, k}:
				sent++
			case err := <-errs:
				close(jobs)
				wg.Wait()
				return sent, fmt.Errorf("bench: prefill: %w", err)
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return sent, fmt.Errorf("bench: prefill: %w", err)
	default:
	}
	return sent, ctx.Err()
}

// sseClient reads one SSE stream and times the bench's upserts.
type sseClient struct {
	body        io.ReadCloser
	run         string
	sent        []atomic.Int64
	mu          sync.Mutex
	seen        []bool
	latency     []time.Duration
	dups        int
	first, last time.Time
}

func openStream(ctx context.Context, url, run string, sent []atomic.Int64) (*sseClient, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: open the stream: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		res.Body.Close()
		return nil, fmt.Errorf("bench: open the stream: %s", res.Status)
	}
	return &sseClient{body: res.Body, run: run, sent: sent, seen: make([]bool, len(sent))}, nil
}

func (s *sseClient) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.latency)
}

// read consumes the stream until it ends (the bench cancels it).
func (s *sseClient) read() {
	defer s.body.Close()
	r := bufio.NewReaderSize(s.body, 64<<10)
	var c struct {
		AgentID      string `json:"agent_id"`
		Op           string `json:"op"`
		Notification struct {
			Message string `json:"message"`
		} `json:"notification"`
	}
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return
		}
		at := time.Now()
		data, ok := strings.CutPrefix(string(line), "data: ")
		if !ok {
			continue
		}
		if json.Unmarshal([]byte(data), &c) != nil || c.Op != notifications.OpUpsert || !strings.HasPrefix(c.AgentID, s.run) {
			continue
		}
		i, err := strconv.Atoi(strings.TrimPrefix(c.Notification.Message, "b"))
		if err != nil || i < 0 || i >= len(s.sent) {
			continue
		}
		t0 := s.sent[i].Load()
		s.mu.Lock()
		if s.seen[i] {
			s.dups++
		} else if t0 != 0 {
			s.seen[i] = true
			s.latency = append(s.latency, at.Sub(time.Unix(0, t0)))
			if s.first.IsZero() {
				s.first = at
			}
			s.last = at
		}
		s.mu.Unlock()
	}
}

// WriteText prints the result.
func (r *NotifyResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "notify: n=%d at %.0f/s over %d agents, %d SSE clients (all agents)\n", r.N, r.Rate, r.Agents, r.Clients)
	if r.Prefilled > 0 {
		fmt.Fprintf(w, "prefilled: %d notifications in %.1fs before the measure (steady state: every notify evicts)\n", r.Prefilled, r.PrefillS)
	}
	fmt.Fprintf(w, "sent/s: %.0f  notify reply ms: p50 %.2f  p99 %.2f  max %.2f\n", r.SentPerS, r.ReplyMs.P50, r.ReplyMs.P99, r.ReplyMs.Max)
	fmt.Fprintf(w, "publish to SSE ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", r.DeliveryMs.P50, r.DeliveryMs.P90, r.DeliveryMs.P99, r.DeliveryMs.Max)
	fmt.Fprintf(w, "SSE events/s (all clients): %.0f  missed: %d  duplicates: %d  failed: %d\n", r.EventsPerS, r.Missed, r.Duplicates, r.Failed)
	fmt.Fprintf(w, "peak rss: %.1f MiB\n", float64(r.PeakRSSBytes)/(1<<20))
}

// Err fails the run when a client missed a notification, saw one twice,
// or a notify failed.
func (r *NotifyResult) Err() error {
	if r.Missed > 0 || r.Duplicates > 0 || r.Failed > 0 {
		return fmt.Errorf("bench: notify: %d missed, %d duplicated, %d failed", r.Missed, r.Duplicates, r.Failed)
	}
	return nil
}
