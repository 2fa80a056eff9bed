package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/replica"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// HistoryOptions configures a history benchmark: what finished timers,
// kept for retention with their inbox envelopes, cost in memory.
type HistoryOptions struct {
	N       int // timers created, then fired, per round
	Rounds  int // rounds; memory is measured after each
	Agents  int // agents the timers are spread over
	Clients int // concurrent creating clients
	// DedupWindow and Retention are the replica's CHIME_DEDUP_WINDOW and
	// CHIME_RECORD_RETENTION (their defaults when zero).
	DedupWindow, Retention time.Duration
	// Settle is how long each round waits, its records written, before
	// memory is measured: past the server's per-block caches (10 s) and
	// subject state (2 min), what remains is what history costs.
	Settle time.Duration
	// HeapProfile, when set, is a file for a heap profile at the end.
	HeapProfile string
	Log         *slog.Logger
}

// Validate checks the options.
func (o *HistoryOptions) Validate() error {
	switch {
	case o.N <= 0:
		return errors.New("bench: -n must be positive")
	case o.Rounds <= 0:
		return errors.New("bench: --rounds must be positive")
	case o.Agents <= 0:
		return errors.New("bench: --agents must be positive")
	case o.Clients <= 0:
		return errors.New("bench: -c must be positive")
	case o.DedupWindow < 0 || o.Retention < 0 || o.Settle < 0:
		return errors.New("bench: --dedup-window, --retention and --settle must not be negative")
	}
	return nil
}

// HistoryRound is the memory after one round, against the start.
type HistoryRound struct {
	Finished int `json:"finished"` // finished timers kept, in all
	// Per finished timer: RSS and Go heap in use (the embedded server's
	// and chime's, one process), and the heap split by who allocated it.
	RSSPerTimer    float64 `json:"rss_per_timer_bytes"`
	HeapPerTimer   float64 `json:"heap_per_timer_bytes"`
	ServerPerTimer float64 `json:"server_heap_per_timer_bytes"`
	ChimePerTimer  float64 `json:"chime_heap_per_timer_bytes"`
}

// HistoryResult is what a history benchmark measured.
type HistoryResult struct {
	N             int            `json:"n"`
	Agents        int            `json:"agents"`
	DedupWindowMs int64          `json:"dedup_window_ms"`
	RetentionMs   int64          `json:"retention_ms"`
	Rounds        []HistoryRound `json:"rounds"`
	Missed        int            `json:"missed"`
}

// heapSampleRate is the heap profile's sampling while the benchmark runs:
// fine enough that a few bytes per timer show.
const heapSampleRate = 4096

// History runs the benchmark on an in-process replica and embedded server
// with the production retention settings: each round creates N one-shot
// timers due at once, waits until every one has fired and its record is
// written finished, then lets the process settle and measures.
func History(ctx context.Context, o HistoryOptions) (*HistoryResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.DedupWindow == 0 {
		o.DedupWindow = 10 * time.Minute
	}
	if o.Retention == 0 {
		o.Retention = 168 * time.Hour
	}
	runtime.MemProfileRate = heapSampleRate
	defer func() { runtime.MemProfileRate = 512 * 1024 }()
	dir, err := os.MkdirTemp("", "chime-bench-history-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer os.RemoveAll(dir)
	cfg := &config.Config{
		DataDir: dir, NATSListen: "127.0.0.1:-1", HTTPAddr: "127.0.0.1:0", JSReplicas: 1, ReplicaID: "bench", Shards: 32,
		LeaseTTL: 2 * time.Second, InboxMaxAge: 168 * time.Hour, EventMaxAge: 24 * time.Hour, InboxMaxPerAgent: 10000,
		DedupWindow: o.DedupWindow, RecordRetention: o.Retention, LogLevel: "warn", LogFormat: "text",
	}
	r, err := replica.Start(ctx, cfg, o.Log, "0.0.0-bench")
	if err != nil {
		return nil, err
	}
	defer r.Stop(context.Background())
	nc, err := nats.Connect(r.NATSURL(), nats.Name("chime-bench history"))
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	stream, err := js.Stream(ctx, "KV_"+engine.TimersBucket)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	inbox := make(chan struct{}, 1024)
	sub, err := nc.Subscribe("agent.*.inbox", func(*nats.Msg) { inbox <- struct{}{} })
	if err != nil {
		return nil, fmt.Errorf("bench: subscribe: %w", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		return nil, fmt.Errorf("bench: flush: %w", err)
	}
	run := fmt.Sprintf("h%d", time.Now().UnixNano()%1e9)
	res := &HistoryResult{N: o.N, Agents: o.Agents, DedupWindowMs: o.DedupWindow.Milliseconds(), RetentionMs: o.Retention.Milliseconds()}
	// Warm up, so that what is allocated once (pools, buffers, the
	// agents' per-subject state) is not counted as history.
	warm := o
	warm.N = max(o.N/10, o.Agents)
	if _, err := historyRound(ctx, nc, js, stream, inbox, warm, run); err != nil {
		return nil, err
	}
	rss0, heap0, split0 := memory(ctx, o.Settle)
	for round := range o.Rounds {
		missed, err := historyRound(ctx, nc, js, stream, inbox, o, run)
		if err != nil {
			return nil, err
		}
		res.Missed += missed
		rss, heap, split := memory(ctx, o.Settle)
		n := float64((round + 1) * o.N)
		res.Rounds = append(res.Rounds, HistoryRound{
			Finished: (round + 1) * o.N, RSSPerTimer: float64(rss-rss0) / n, HeapPerTimer: float64(int64(heap)-int64(heap0)) / n,
			ServerPerTimer: (split.server - split0.server) / n, ChimePerTimer: (split.other - split0.other) / n,
		})
	}
	if o.HeapProfile != "" {
		f, err := os.Create(o.HeapProfile)
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		defer f.Close()
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			return nil, fmt.Errorf("bench: heap profile: %w", err)
		}
	}
	return res, nil
}

// historyRound creates o.N timers due 1 s after the last create, waits for
// their fires and then for their records to be written finished (one
// create and one update each in the timers bucket) and, where finished
// timers go to the history stream, stored there; it returns how many
// fires did not come.
func historyRound(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, stream jetstream.Stream, inbox chan struct{}, o HistoryOptions, run string) (int, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	first := info.State.LastSeq
	// A build that moves finished timers to the history stream has done
	// so when the stream holds N more; an earlier build has no such stream.
	hist, archived := js.Stream(ctx, engine.HistoryStream)
	var histFirst uint64
	if archived == nil {
		hi, err := hist.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("bench: %w", err)
		}
		histFirst = hi.State.LastSeq
	}
	g, gctx := errgroup.WithContext(ctx)
	for c := range o.Clients {
		g.Go(func() error {
			for i := c; i < o.N; i += o.Clients {
				subject := subjects.Agent(fmt.Sprintf("%s-%d", run, i%o.Agents), subjects.ActionTimerCreate)
				msg, err := nc.RequestWithContext(gctx, subject, []byte(`{"duration_ms":`+strconv.Itoa(1000)+`}`))
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
		return 0, err
	}
	got := 0
	deadline := time.After(time.Minute)
	for got < o.N {
		select {
		case <-inbox:
			got++
		case <-deadline:
			return o.N - got, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	for {
		info, err := stream.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("bench: %w", err)
		}
		done := info.State.LastSeq-first >= uint64(2*o.N)
		if done && archived == nil {
			hi, err := hist.Info(ctx)
			if err != nil {
				return 0, fmt.Errorf("bench: %w", err)
			}
			done = hi.State.LastSeq-histFirst >= uint64(o.N)
		}
		if done {
			return 0, nil
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			return 0, fmt.Errorf("bench: %d of %d timer records not written finished in time", uint64(2*o.N)-(info.State.LastSeq-first), o.N)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// heapSplit is the sampled heap in use by who allocated it: the embedded
// nats-server, or the rest (chime, its clients, the runtime).
type heapSplit struct{ server, other float64 }

// memory lets the process settle for settle, returns memory to the OS, and reports
// RSS, heap in use, and the heap's split.
func memory(ctx context.Context, settle time.Duration) (int64, uint64, heapSplit) {
	select {
	case <-time.After(settle):
	case <-ctx.Done():
	}
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return currentRSS(), m.HeapInuse, splitHeap()
}

// splitHeap attributes the sampled heap in use to the embedded server when
// a frame of its allocation is nats-server's, scaling each sample as the
// heap profile does.
func splitHeap() heapSplit {
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, false)
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.MemProfile(recs, false); ok {
			recs = recs[:n]
			break
		}
	}
	var s heapSplit
	for i := range recs {
		rec := &recs[i]
		objs := rec.InUseObjects()
		if objs == 0 {
			continue
		}
		size := float64(rec.InUseBytes()) / float64(objs)
		scale := 1 / (1 - math.Exp(-size/heapSampleRate))
		bytes := float64(rec.InUseBytes()) * scale
		if fromServer(rec.Stack()) {
			s.server += bytes
		} else {
			s.other += bytes
		}
	}
	return s
}

func fromServer(stack []uintptr) bool {
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "github.com/nats-io/nats-server/") {
			return true
		}
		if !more {
			return false
		}
	}
}

// WriteText prints a result for people.
func (r *HistoryResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "history: n=%d per round, agents=%d, dedup window %s, retention %s\n", r.N, r.Agents,
		time.Duration(r.DedupWindowMs)*time.Millisecond, time.Duration(r.RetentionMs)*time.Millisecond)
	fmt.Fprintf(w, "%10s %12s %12s %14s %14s\n", "finished", "rss B/timer", "heap B/timer", "server heap B", "chime heap B")
	for _, x := range r.Rounds {
		fmt.Fprintf(w, "%10d %12.0f %12.0f %14.0f %14.0f\n", x.Finished, x.RSSPerTimer, x.HeapPerTimer, x.ServerPerTimer, x.ChimePerTimer)
	}
	fmt.Fprintf(w, "missed: %d\n", r.Missed)
}
