package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/notifications"
)

// NotifyMemoryOptions configures a notification memory run: an external
// nats-server and Replicas chime replicas (child processes of Exe), Agents
// agents sent PerAgent notifications each with DetailBytes of HTML detail,
// each replica's RSS and Go heap read before and after, then the latency
// of Lists histories read over HTTP.
type NotifyMemoryOptions struct {
	Servers     int // 1: a standalone nats-server; 3-5: a JetStream cluster, chime's streams at R3
	Replicas    int
	Agents      int
	PerAgent    int
	DetailBytes int
	InFlight    int
	Lists       int
	// Settle is waited after the writes before memory is read: no
	// endpoint forces a GC, so the writes' garbage is given time to go.
	Settle time.Duration
	// MaxRSS stops the writes when a replica's RSS passes it (0: never),
	// so that a run of code that holds everything cannot take the machine.
	MaxRSS   int64
	Exe      string
	Progress io.Writer
}

// Validate checks the options.
func (o *NotifyMemoryOptions) Validate() error {
	switch {
	case o.Servers != 1 && (o.Servers < 3 || o.Servers > 5):
		return errors.New("bench: --servers must be 1 (standalone) or 3-5 (a cluster)")
	case o.Replicas < 1:
		return errors.New("bench: --replicas must be positive")
	case o.Agents < 1:
		return errors.New("bench: --agents must be positive")
	case o.PerAgent < 1:
		return errors.New("bench: --per-agent must be positive")
	case o.DetailBytes < 0:
		return errors.New("bench: --detail-bytes must not be negative")
	case o.InFlight < 1:
		return errors.New("bench: --in-flight must be positive")
	case o.Lists < 0:
		return errors.New("bench: --lists must not be negative")
	case o.Settle < 0:
		return errors.New("bench: --settle must not be negative")
	case o.MaxRSS < 0:
		return errors.New("bench: --max-rss must not be negative")
	}
	return nil
}

// NotifyMemoryResult is what a notification memory run measured.
type NotifyMemoryResult struct {
	Servers     int `json:"servers"`
	Replicas    int `json:"replicas"`
	Agents      int `json:"agents"`
	PerAgent    int `json:"per_agent"`
	DetailBytes int `json:"detail_bytes"`
	// Sent is how many notifications were stored (fewer than Agents ×
	// PerAgent when MaxRSS stopped the writes: Stopped says why).
	Sent        int                   `json:"sent"`
	Failed      int                   `json:"failed"`
	Stopped     string                `json:"stopped,omitempty"`
	WriteS      float64               `json:"write_s"`
	StoredBytes uint64                `json:"stored_bytes"` // the bucket's stream, as JetStream counts it
	PerReplica  []NotifyMemoryReplica `json:"per_replica"`
	// ServerRSSBytes is each nats-server's RSS after the writes.
	ServerRSSBytes []int64 `json:"server_rss_bytes"`
	// ListMs: one agent's whole history over HTTP, from a replica chosen
	// at random, one request at a time; BadLists are those that did not
	// hold the agent's PerAgent notifications with their details.
	Lists    int     `json:"lists"`
	ListMs   Latency `json:"list_ms"`
	BadLists int     `json:"bad_lists"`
}

// NotifyMemoryReplica is one replica's memory before and after the writes.
type NotifyMemoryReplica struct {
	Name      string `json:"name"`
	RSSBefore int64  `json:"rss_before_bytes"`
	RSSAfter  int64  `json:"rss_after_bytes"`
	// RSSAfterLists is after the lists (their garbage included).
	RSSAfterLists int64 `json:"rss_after_lists_bytes"`
	HeapBefore    int64 `json:"heap_before_bytes"`
	HeapAfter     int64 `json:"heap_after_bytes"`
}

// NotifyMemory runs the measurement.
func NotifyMemory(ctx context.Context, o NotifyMemoryOptions) (res *NotifyMemoryResult, err error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Exe, err = ownExe(o.Exe); err != nil {
		return nil, err
	}
	progress := progressf(o.Progress, "notify-memory")
	f, err := startFleet(ctx, fleetOptions{
		servers: o.Servers, replicas: o.Replicas, exe: o.Exe, progress: progress,
		// No pacing, no bucket size limit, and a per-agent limit that keeps
		// every notification sent.
		env: []string{"CHIME_NOTIFY_RATE=0", "CHIME_NOTIFICATIONS_MAX_BYTES=0", fmt.Sprintf("CHIME_NOTIFICATIONS_MAX=%d", o.PerAgent)},
	})
	if err != nil {
		return nil, err
	}
	defer func() { f.close(err != nil) }()
	conns, closeConns, err := connectN(f.urls(), scaleConns, "chime-bench notify-memory")
	if err != nil {
		return nil, err
	}
	defer closeConns()

	res = &NotifyMemoryResult{Servers: o.Servers, Replicas: o.Replicas, Agents: o.Agents, PerAgent: o.PerAgent, DetailBytes: o.DetailBytes}
	if !backoff.Sleep(ctx, idleSettle) {
		return nil, ctx.Err()
	}
	for _, p := range f.replicas {
		m, err := scrape(ctx, p.httpAddr)
		if err != nil {
			return nil, err
		}
		res.PerReplica = append(res.PerReplica, NotifyMemoryReplica{Name: p.id, RSSBefore: int64(m[metricRSS]), HeapBefore: int64(m[metricHeap])})
	}

	prefix := fmt.Sprintf("nm%d", time.Now().UnixNano()%1e6)
	agent := func(i int) string { return fmt.Sprintf("%s-%d", prefix, i) }
	detail := detailHTML(o.DetailBytes)
	progress("writing %d agents × %d notifications with %d B of detail, %d in flight", o.Agents, o.PerAgent, o.DetailBytes, o.InFlight)
	start := time.Now()
	res.Sent, res.Failed, res.Stopped, err = writeNotifications(ctx, conns, f, o, agent, detail, progress)
	if err != nil {
		return nil, err
	}
	res.WriteS = time.Since(start).Seconds()
	progress("%d stored in %.1fs (%d failed); settling %v", res.Sent, res.WriteS, res.Failed, o.Settle)
	if !backoff.Sleep(ctx, o.Settle) {
		return nil, ctx.Err()
	}
	for i, p := range f.replicas {
		m, err := scrape(ctx, p.httpAddr)
		if err != nil {
			return nil, err
		}
		res.PerReplica[i].RSSAfter, res.PerReplica[i].HeapAfter = int64(m[metricRSS]), int64(m[metricHeap])
	}
	for _, s := range f.servers {
		res.ServerRSSBytes = append(res.ServerRSSBytes, procRSS(s.Pid()))
	}
	if res.StoredBytes, err = bucketBytes(ctx, conns[0]); err != nil {
		return nil, err
	}

	if o.Lists > 0 && res.Stopped == "" {
		progress("reading %d histories over HTTP", o.Lists)
		var took []time.Duration
		if took, res.BadLists, err = listHistories(ctx, f, o, agent, detail); err != nil {
			return nil, err
		}
		res.Lists, res.ListMs = len(took), summarize(took)
		for i, p := range f.replicas {
			m, err := scrape(ctx, p.httpAddr)
			if err != nil {
				return nil, err
			}
			res.PerReplica[i].RSSAfterLists = int64(m[metricRSS])
		}
	}
	return res, nil
}

// detailHTML is n bytes of HTML that the console's sanitizer keeps most of.
func detailHTML(n int) string {
	const para = "<p>The <b>build</b> of <a href=\"https://example.com/ci\">the service</a> finished: <code>ok</code>, 3 warnings.</p>\n"
	var b strings.Builder
	for b.Len()+len(para) <= n {
		b.WriteString(para)
	}
	b.WriteString(strings.Repeat("x", n-b.Len()))
	return b.String()
}

// writeNotifications sends every agent its notifications, round after
// round over the agents, with InFlight requests at once; it checks the
// replicas' RSS after every 5% and stops when one passes MaxRSS.
func writeNotifications(ctx context.Context, conns []*nats.Conn, f *fleet, o NotifyMemoryOptions, agent func(int) string, detail string,
	progress func(string, ...any)) (sent, failed int, stopped string, err error) {
	total := o.Agents * o.PerAgent
	clients := make([]*client.Client, o.Agents)
	for i := range clients {
		if clients[i], err = client.New(conns[i%len(conns)], agent(i)); err != nil {
			return 0, 0, "", err
		}
	}
	var ok, bad atomic.Int64
	var firstErr atomic.Value
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range o.InFlight {
		wg.Go(func() {
			for j := range jobs {
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := clients[j%o.Agents].Notify(rctx, client.Notification{
					Message: "m" + strconv.Itoa(j/o.Agents), Title: "bench", Detail: detail, Type: notifications.NotifyInfo,
				})
				cancel()
				if err != nil {
					bad.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				ok.Add(1)
			}
		})
	}
	step := max(total/20, 1)
feed:
	for j := range total {
		select {
		case jobs <- j:
		case <-ctx.Done():
			break feed
		}
		if (j+1)%step != 0 {
			continue
		}
		var rss []string
		for _, p := range f.replicas {
			m, err := scrape(ctx, p.httpAddr)
			if err != nil {
				stopped = err.Error()
				break feed
			}
			r := int64(m[metricRSS])
			rss = append(rss, fmt.Sprintf("%s %.0f MiB", p.id, float64(r)/(1<<20)))
			if o.MaxRSS > 0 && r > o.MaxRSS {
				stopped = fmt.Sprintf("%s's RSS %d B passed --max-rss %d B after %d notifications", p.id, r, o.MaxRSS, j+1)
			}
		}
		progress("%d of %d sent; RSS %s", j+1, total, strings.Join(rss, ", "))
		if stopped != "" {
			break
		}
	}
	close(jobs)
	wg.Wait()
	if e, _ := firstErr.Load().(string); e != "" {
		progress("first failure: %s", e)
	}
	return int(ok.Load()), int(bad.Load()), stopped, ctx.Err()
}

// bucketBytes is the notifications bucket's stream size.
func bucketBytes(ctx context.Context, nc *nats.Conn) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.INFO.KV_chime_notifications", nil)
	if err != nil {
		return 0, fmt.Errorf("bench: stream info: %w", err)
	}
	var info struct {
		State struct {
			Bytes uint64 `json:"bytes"`
		} `json:"state"`
	}
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		return 0, fmt.Errorf("bench: stream info: %w", err)
	}
	return info.State.Bytes, nil
}

// listHistories reads Lists whole histories of random agents over HTTP,
// each from a random replica, one at a time, and checks each.
func listHistories(ctx context.Context, f *fleet, o NotifyMemoryOptions, agent func(int) string, detail string) ([]time.Duration, int, error) {
	c := &http.Client{Timeout: 30 * time.Second}
	var took []time.Duration
	bad := 0
	for range o.Lists {
		p := f.replicas[rand.IntN(len(f.replicas))]
		url := "http://" + p.httpAddr + "/api/agents/" + agent(rand.IntN(o.Agents)) + "/notifications"
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, 0, fmt.Errorf("bench: %w", err)
		}
		t0 := time.Now()
		res, err := c.Do(req)
		if err != nil {
			return nil, 0, fmt.Errorf("bench: list: %w", err)
		}
		var h notifications.ListNotificationsReply
		err = json.NewDecoder(res.Body).Decode(&h)
		res.Body.Close()
		took = append(took, time.Since(t0))
		if err != nil || res.StatusCode != http.StatusOK || h.Count != o.PerAgent || len(h.Notifications) != o.PerAgent || h.Notifications[0].Detail != detail {
			bad++
		}
	}
	return took, bad, nil
}

// procRSS is a process's resident set from /proc, 0 when it cannot be
// read.
func procRSS(pid int) int64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// WriteText prints the result.
func (r *NotifyMemoryResult) WriteText(w io.Writer) {
	mib := func(b int64) string { return fmt.Sprintf("%.0f", float64(b)/(1<<20)) }
	fmt.Fprintf(w, "notify-memory: %d agents × %d notifications, %d B detail, %d replicas, %d nats-server(s)\n",
		r.Agents, r.PerAgent, r.DetailBytes, r.Replicas, r.Servers)
	fmt.Fprintf(w, "stored: %d notifications (%d failed) in %.1fs, bucket %.0f MiB\n", r.Sent, r.Failed, r.WriteS, float64(r.StoredBytes)/(1<<20))
	if r.Stopped != "" {
		fmt.Fprintf(w, "stopped: %s\n", r.Stopped)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "replica\tRSS before MiB\tRSS after MiB\tgrowth MiB\tafter lists MiB\theap before MiB\theap after MiB\t")
	for _, p := range r.PerReplica {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", p.Name, mib(p.RSSBefore), mib(p.RSSAfter), mib(p.RSSAfter-p.RSSBefore),
			mib(p.RSSAfterLists), mib(p.HeapBefore), mib(p.HeapAfter))
	}
	tw.Flush()
	for i, b := range r.ServerRSSBytes {
		fmt.Fprintf(w, "nats-server %d RSS: %s MiB\n", i+1, mib(b))
	}
	if r.Lists > 0 {
		fmt.Fprintf(w, "lists: %d over HTTP, ms p50 %.2f  p90 %.2f  p99 %.2f  max %.2f; %d bad\n", r.Lists, r.ListMs.P50, r.ListMs.P90, r.ListMs.P99, r.ListMs.Max, r.BadLists)
	}
}

// Err fails the run when a write or a list failed.
func (r *NotifyMemoryResult) Err() error {
	if r.Failed > 0 || r.BadLists > 0 {
		return fmt.Errorf("bench: notify-memory: %d notifies failed, %d lists bad", r.Failed, r.BadLists)
	}
	return nil
}
