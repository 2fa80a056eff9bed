// Package bench owns chime's load generators: they drive a chime (their own
// in-process replica on an embedded server, or the replicas behind
// CHIME_NATS_URL) through the same NATS subjects agents use and measure
// what an agent sees.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/secret"
	"github.com/chime-nats/chime/replica"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// TimersOptions configures a timer benchmark.
type TimersOptions struct {
	N       int           // timers to create
	Clients int           // concurrent creating clients
	Lead    time.Duration // first due time after the start
	Spread  time.Duration // due times spread evenly over this
	Hold    bool          // create far-future timers and measure memory instead of fires
	Peer    bool          // then measure JetStream's own message schedules the same way
	NATSURL string        // empty: run an in-process chime on an embedded server
	// Token connects to NATSURL (CHIME_NATS_TOKEN): an operator's where
	// NATS authorization is on.
	Token string
	// AgentTokens makes each client its agent: a token issued for it (an
	// operator's right), a connection of its own with the agent's inbox
	// prefix, so that creates pass the auth callout and reply check an
	// agent meets. Fires are still read by one operator connection.
	AgentTokens bool
	// Auth runs the in-process chime with NATS authorization on; the
	// bench connects as an operator.
	Auth bool
	Log  *slog.Logger
	// FireProfile, when set, is a file for a CPU profile of the fire window
	// alone: from just before the first due time to the last fire's arrival
	// (the in-process chime, its embedded server and the bench's subscriber).
	FireProfile string
	// CreateProfile, when set, is a file for a CPU profile of the creates
	// alone, as FireProfile is of the fires.
	CreateProfile string
}

// Validate checks the options.
func (o *TimersOptions) Validate() error {
	switch {
	case o.N <= 0:
		return errors.New("bench: -n must be positive")
	case o.Clients <= 0:
		return errors.New("bench: -c must be positive")
	case o.Lead < 0:
		return errors.New("bench: --lead must not be negative")
	case o.Spread < 0:
		return errors.New("bench: --spread must not be negative")
	case o.Auth && o.Peer:
		return errors.New("bench: --peer needs the JetStream API, which an operator's rights do not cover: not with --auth")
	case o.Token != "" && o.Peer:
		return errors.New("bench: --peer needs the JetStream API, which an operator's rights do not cover: not with a token")
	case o.AgentTokens && o.Token == "" && !o.Auth:
		return errors.New("bench: --agent-tokens needs an operator to issue them: --auth, or CHIME_NATS_TOKEN with CHIME_NATS_URL")
	}
	return nil
}

// Latency is a lateness summary in milliseconds.
type Latency struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// TimersResult is what a timer benchmark measured.
type TimersResult struct {
	N            int     `json:"n"`
	Clients      int     `json:"clients"`
	LeadMs       int64   `json:"lead_ms"`
	SpreadMs     int64   `json:"spread_ms"`
	CreatesPerS  float64 `json:"creates_per_s"`
	FiresPerS    float64 `json:"fires_per_s"`
	LatenessMs   Latency `json:"lateness_ms"`
	Missed       int     `json:"missed"`
	Duplicates   int     `json:"duplicates"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
	// AgentTokens: each client created as its agent, with a token of its own.
	AgentTokens bool `json:"agent_tokens,omitempty"`
	// Hold mode only: memory per active timer.
	RSSPerTimerBytes  float64 `json:"rss_per_timer_bytes,omitempty"`
	HeapPerTimerBytes float64 `json:"heap_per_timer_bytes,omitempty"`
	// Peer only (and not with hold): JetStream's own message schedules,
	// measured after the timers on the same server.
	Peer *PeerResult `json:"peer,omitempty"`
}

// Timers runs the benchmark.
func Timers(ctx context.Context, o TimersOptions) (*TimersResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Hold {
		o.Lead = time.Hour
	}
	url, auth, stop, err := target(ctx, o.NATSURL, o.Token, o.Auth, o.Log)
	if err != nil {
		return nil, err
	}
	defer stop()
	res := &TimersResult{N: o.N, Clients: o.Clients, LeadMs: o.Lead.Milliseconds(), SpreadMs: o.Spread.Milliseconds(), AgentTokens: o.AgentTokens}
	run := fmt.Sprintf("b%d", time.Now().UnixNano()%1e9)
	agent := func(c int) string { return fmt.Sprintf("%s-%d", run, c) }
	var conns []*nats.Conn
	if o.AgentTokens {
		if conns, err = agentConns(ctx, url, auth, o.Clients, agent); err != nil {
			return nil, err
		}
	} else {
		conns = make([]*nats.Conn, min(o.Clients, 4))
		for i := range conns {
			if conns[i], err = nats.Connect(url, append(auth, nats.Name("chime-bench"))...); err != nil {
				closeAll(conns)
				return nil, fmt.Errorf("bench: connect: %w", err)
			}
		}
	}
	defer closeAll(conns)

	// Subscribe first, as an agent would, on its own connection.
	sub, err := nats.Connect(url, append(auth, nats.Name("chime-bench inbox"))...)
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer sub.Close()
	inbox := newArrivals(subjects.HeaderMsgID, o.N)
	s, err := sub.Subscribe("agent.*.inbox", func(m *nats.Msg) {
		if strings.HasPrefix(m.Subject, "agent."+run) {
			inbox.add(m)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("bench: subscribe: %w", err)
	}
	s.SetPendingLimits(-1, -1)
	defer func() { _ = s.Unsubscribe() }()
	if err := sub.Flush(); err != nil {
		return nil, fmt.Errorf("bench: flush: %w", err)
	}

	var rssBefore int64
	var heapBefore uint64
	if o.Hold {
		rssBefore, heapBefore = settle()
	}
	stopCreateProfile := func() {}
	if o.CreateProfile != "" {
		if stopCreateProfile, err = profileFrom(ctx, o.CreateProfile, time.Now()); err != nil {
			return nil, err
		}
		defer stopCreateProfile() // on error; normally stopped after the creates
	}
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for c := range o.Clients {
		nc := conns[c%len(conns)]
		subject := subjects.Agent(agent(c), subjects.ActionTimerCreate)
		g.Go(func() error {
			for i := c; i < o.N; i += o.Clients {
				due := start.Add(o.Lead + time.Duration(int64(o.Spread)*int64(i)/int64(o.N)))
				ms := max(time.Until(due).Milliseconds(), 1)
				msg, err := nc.RequestWithContext(gctx, subject, []byte(`{"duration_ms":`+strconv.FormatInt(ms, 10)+`}`))
				if err != nil {
					return fmt.Errorf("bench: create: %w", err)
				}
				var t timers.Timer
				if err := subjects.DecodeReply(msg.Data, &t); err != nil {
					return fmt.Errorf("bench: create: %w", err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	res.CreatesPerS = float64(o.N) / time.Since(start).Seconds()
	stopCreateProfile()
	if o.Hold {
		rss, heap := settle()
		res.RSSPerTimerBytes = float64(rss-rssBefore) / float64(o.N)
		res.HeapPerTimerBytes = float64(int64(heap)-int64(heapBefore)) / float64(o.N)
		res.PeakRSSBytes = peakRSS()
		return res, nil
	}
	wait := time.Until(start.Add(o.Lead+o.Spread)) + 10*time.Second
	deadline := time.After(wait)
	if o.FireProfile != "" {
		stopProfile, err := profileFrom(ctx, o.FireProfile, start.Add(o.Lead-20*time.Millisecond))
		if err != nil {
			return nil, err
		}
		defer stopProfile() // on error; normally stopped at the last fire
		select {
		case <-inbox.all:
		case <-deadline:
		case <-ctx.Done():
		}
		stopProfile()
	}
	select {
	case <-inbox.all:
	case <-deadline:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	res.LatenessMs, res.FiresPerS, res.Missed, res.Duplicates = inbox.summary()
	res.PeakRSSBytes = peakRSS()
	if o.Peer {
		// After, not during: let the timers' trailing work (record updates,
		// acks) settle so that the peer has the server to itself.
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if res.Peer, err = peer(ctx, url, o, run); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// arrivals collects timer_fired deliveries as an agent receives them, for
// chime and its peer alike. add stamps the arrival and keeps the message
// (deduplicated by the id in a header); decoding waits for summary, after
// the fires, so that the measuring agent neither competes for the CPU with
// what it measures nor delays the next arrival's stamp.
type arrivals struct {
	header string // the header carrying a delivery's id
	want   int
	all    chan struct{} // closed at want distinct arrivals

	mu   sync.Mutex
	seen map[string]struct{}
	got  []arrival
	dups int
}

type arrival struct {
	at   time.Time
	data []byte
}

func newArrivals(header string, want int) *arrivals {
	return &arrivals{header: header, want: want, all: make(chan struct{}), seen: make(map[string]struct{}, want), got: make([]arrival, 0, want)}
}

func (a *arrivals) add(m *nats.Msg) {
	now := time.Now()
	id := m.Header.Get(a.header)
	if id == "" {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.seen[id]; ok {
		a.dups++
		return
	}
	a.seen[id] = struct{}{}
	a.got = append(a.got, arrival{at: now, data: m.Data})
	if len(a.got) == a.want {
		close(a.all)
	}
}

// summary decodes the arrivals and returns the lateness of each (arrival
// minus the due_at it carries), the arrival rate, the missed (never came,
// or undecodable) and the duplicates.
func (a *arrivals) summary() (Latency, float64, int, int) {
	a.mu.Lock()
	got, dups := a.got, a.dups
	a.mu.Unlock()
	lateness := make([]time.Duration, 0, len(got))
	var first, last time.Time
	for _, r := range got {
		var env subjects.Envelope
		var data timers.TimerFiredData
		if json.Unmarshal(r.data, &env) != nil || json.Unmarshal(env.Data, &data) != nil {
			continue
		}
		if first.IsZero() || r.at.Before(first) {
			first = r.at
		}
		last = maxTime(last, r.at)
		lateness = append(lateness, r.at.Sub(data.DueAt))
	}
	var rate float64
	if span := last.Sub(first).Seconds(); span > 0 {
		rate = float64(len(lateness)) / span
	}
	return summarize(lateness), rate, a.want - len(lateness), dups
}

// profileFrom waits until at, then starts a CPU profile into path; the
// returned func stops it (once).
func profileFrom(ctx context.Context, path string, at time.Time) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	select {
	case <-time.After(time.Until(at)):
	case <-ctx.Done():
		_ = f.Close()
		return nil, ctx.Err()
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("bench: fire profile: %w", err)
	}
	var once sync.Once
	return func() { once.Do(func() { pprof.StopCPUProfile(); _ = f.Close() }) }, nil
}

// agentConns issues a token for each of n agents, named by agent, with
// the operator's rights in auth, and connects as each of them.
func agentConns(ctx context.Context, url string, auth []nats.Option, n int, agent func(int) string) ([]*nats.Conn, error) {
	op, err := nats.Connect(url, append(auth, nats.Name("chime-bench operator"))...)
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer op.Close()
	conns := make([]*nats.Conn, 0, n)
	for i := range n {
		tok, err := issueToken(ctx, op, agent(i))
		if err == nil {
			var nc *nats.Conn
			if nc, err = nats.Connect(url, append(client.ConnectOptions(agent(i), tok), nats.Name("chime-bench agent"))...); err == nil {
				conns = append(conns, nc)
				continue
			}
			err = fmt.Errorf("bench: connect as agent %s: %w", agent(i), err)
		}
		closeAll(conns)
		return nil, err
	}
	return conns, nil
}

// issueToken issues a token for agentID over op, an operator's connection.
func issueToken(ctx context.Context, op *nats.Conn, agentID string) (string, error) {
	c, err := client.New(op, agentID)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tok, err := c.IssueToken(ctx)
	if err != nil {
		return "", fmt.Errorf("bench: issue a token for %s: %w", agentID, err)
	}
	return tok.Token, nil
}

func closeAll(conns []*nats.Conn) {
	for _, nc := range conns {
		if nc != nil {
			nc.Close()
		}
	}
}

// target returns the NATS URL of the chime to drive and the options to
// connect as an operator: url itself with token (if any), or an in-process
// replica (with its HTTP gateway) on an embedded server when url is empty,
// stopped by the returned func.
func target(ctx context.Context, url, token string, auth bool, log *slog.Logger) (string, []nats.Option, func(), error) {
	if url != "" {
		if auth {
			return "", nil, nil, errors.New("bench: --auth runs its own chime: unset CHIME_NATS_URL")
		}
		var opts []nats.Option
		if token != "" {
			opts = append(opts, nats.Token(token))
		}
		return url, opts, func() {}, nil
	}
	if token != "" {
		return "", nil, nil, errors.New("bench: a token (CHIME_NATS_TOKEN) is for the chime at CHIME_NATS_URL, which is unset")
	}
	r, token, stop, err := local(ctx, auth, log)
	if err != nil {
		return "", nil, nil, err
	}
	var opts []nats.Option
	if token != "" {
		opts = append(opts, nats.Token(token))
	}
	return r.NATSURL(), opts, stop, nil
}

// local runs an in-process replica with its HTTP gateway on an embedded
// server, in a directory of its own, until the returned func; with auth,
// NATS authorization is on and token is an operator's, for this run only.
func local(ctx context.Context, auth bool, log *slog.Logger) (r *replica.Replica, token string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "chime-bench-")
	if err != nil {
		return nil, "", nil, fmt.Errorf("bench: %w", err)
	}
	cfg := &config.Config{
		DataDir: dir, NATSListen: "127.0.0.1:-1", HTTPAddr: "127.0.0.1:0", JSReplicas: 1, ReplicaID: "bench", Shards: 32,
		LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, LogLevel: "warn", LogFormat: "text",
	}
	if auth {
		// Its hash is all the file holds.
		token = secret.NewToken("bench_op_")
		cfg.NATSAuth, cfg.OperatorTokensFile = true, filepath.Join(dir, "operators")
		if err := os.WriteFile(cfg.OperatorTokensFile, []byte(secret.Hash(token)+"\n"), 0o600); err != nil {
			_ = os.RemoveAll(dir)
			return nil, "", nil, fmt.Errorf("bench: %w", err)
		}
	}
	if r, err = replica.Start(ctx, cfg, log, "0.0.0-bench"); err != nil {
		_ = os.RemoveAll(dir)
		return nil, "", nil, err
	}
	return r, token, func() { r.Stop(context.Background()); _ = os.RemoveAll(dir) }, nil
}

// summarize sorts d and returns its quantiles in milliseconds.
func summarize(d []time.Duration) Latency {
	n := len(d)
	if n == 0 {
		return Latency{}
	}
	slices.Sort(d)
	q := func(p float64) float64 { return ms(d[min(n-1, int(p*float64(n)))]) }
	return Latency{P50: q(.50), P90: q(.90), P99: q(.99), Max: ms(d[n-1])}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// settle lets the process come to rest and returns current RSS and heap in use.
func settle() (int64, uint64) {
	runtime.GC()
	time.Sleep(2 * time.Second)
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return currentRSS(), m.HeapInuse
}

func currentRSS() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

func peakRSS() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Maxrss * 1024 // KiB on Linux
}

// WriteText prints a result for people.
func (r *TimersResult) WriteText(w io.Writer) {
	as := ""
	if r.AgentTokens {
		as = " (each client its agent, with an agent token)"
	}
	fmt.Fprintf(w, "timers: n=%d clients=%d lead=%dms spread=%dms%s\n", r.N, r.Clients, r.LeadMs, r.SpreadMs, as)
	fmt.Fprintf(w, "creates/s: %.0f\n", r.CreatesPerS)
	if r.RSSPerTimerBytes != 0 || r.HeapPerTimerBytes != 0 {
		fmt.Fprintf(w, "rss per active timer: %.0f B (heap %.0f B)\n", r.RSSPerTimerBytes, r.HeapPerTimerBytes)
	} else {
		if p := r.Peer; p != nil {
			fmt.Fprintf(w, "%-11s %10s %8s %8s %8s %8s %8s %7s %6s\n", "", "creates/s", "fires/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "missed", "dups")
			row := func(name string, creates, fires float64, l Latency, missed, dups int) {
				fmt.Fprintf(w, "%-11s %10.0f %8.0f %8.2f %8.2f %8.2f %8.2f %7d %6d\n", name, creates, fires, l.P50, l.P90, l.P99, l.Max, missed, dups)
			}
			row("chime", r.CreatesPerS, r.FiresPerS, r.LatenessMs, r.Missed, r.Duplicates)
			row("js-schedule", p.SchedulesPerS, p.FiresPerS, p.LatenessMs, p.Missed, p.Duplicates)
		} else {
			fmt.Fprintf(w, "fires/s: %.0f\n", r.FiresPerS)
			fmt.Fprintf(w, "lateness ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", r.LatenessMs.P50, r.LatenessMs.P90, r.LatenessMs.P99, r.LatenessMs.Max)
			fmt.Fprintf(w, "missed: %d  duplicates: %d\n", r.Missed, r.Duplicates)
		}
	}
	fmt.Fprintf(w, "peak rss: %.1f MiB\n", float64(r.PeakRSSBytes)/(1<<20))
}
