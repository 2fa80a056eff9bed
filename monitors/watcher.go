package monitors

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
)

// Owner says which shards this replica holds (scheduler.Leases): a monitor
// of an in-chime source runs on the replica holding the shard of its
// record's key, as a timer fires there, and moves with the shard.
type Owner interface {
	Owned(now time.Time, owned []bool)
}

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// NC is the connection the subjects are watched on.
	NC     *nats.Conn
	Store  *Store
	Index  *Index
	Leases Owner
	Shards int
	Log    *slog.Logger
	// Every is how often the watches are matched to the shards held and
	// the running monitors (default 500 ms).
	Every time.Duration
}

// Watcher runs the NATS subject monitors of the shards this replica
// holds: a core NATS subscription each, whose messages become lines
// ("<subject> <payload>", cut and made valid UTF-8 as CapLine does), gathered
// into batches (Gather) and applied with the store's emit, as an executor's
// would be. The subscription is at most once: what is published while no
// replica watches (a takeover) is not seen.
type Watcher struct {
	cfg     WatcherConfig
	log     *slog.Logger
	mu      sync.Mutex
	watches map[string]*watch // record key -> its watch
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

// watch is one running subject monitor.
type watch struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// watchBuffer bounds the lines a watch holds while its batches are being
// applied; beyond it, messages are dropped and counted as suppressed.
const watchBuffer = 4 * MaxBatchLines

// NewWatcher returns the watcher; Start runs it.
func NewWatcher(c WatcherConfig) *Watcher {
	if c.Every <= 0 {
		c.Every = 500 * time.Millisecond
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{cfg: c, log: c.Log.With("component", "monitors"), watches: map[string]*watch{}}
}

// Start runs the watches until Stop.
func (w *Watcher) Start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		defer close(w.done)
		t := time.NewTicker(w.cfg.Every)
		defer t.Stop()
		for {
			w.reconcile(ctx)
			select {
			case <-ctx.Done():
				w.reconcileTo(ctx, nil)
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Stop ends every watch. Idempotent and safe without Start.
func (w *Watcher) Stop(ctx context.Context) error {
	if w.cancel == nil {
		return nil
	}
	w.once.Do(w.cancel)
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Watching is how many subject monitors this replica watches.
func (w *Watcher) Watching() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.watches)
}

// reconcile watches exactly the running subject monitors of the shards
// held now.
func (w *Watcher) reconcile(ctx context.Context) {
	owned := make([]bool, max(w.cfg.Shards, 1))
	w.cfg.Leases.Owned(time.Now(), owned)
	want := map[string]Watched{}
	for _, m := range w.cfg.Index.RunningOf(SourceSubject) {
		if owned[partitions.ShardOf(m.Key, len(owned))] {
			want[m.Key] = m
		}
	}
	w.reconcileTo(ctx, want)
}

func (w *Watcher) reconcileTo(ctx context.Context, want map[string]Watched) {
	w.mu.Lock()
	var stop []*watch
	for k, wt := range w.watches {
		ended := false
		select {
		case <-wt.done: // ended on its own: started again if still wanted
			ended = true
		default:
		}
		if _, ok := want[k]; !ok || ended {
			stop = append(stop, wt)
			delete(w.watches, k)
		}
	}
	for k, m := range want {
		if _, ok := w.watches[k]; !ok {
			w.watches[k] = w.start(ctx, m)
		}
	}
	w.mu.Unlock()
	for _, wt := range stop {
		wt.cancel()
		<-wt.done
	}
}

// start watches m's subject until its context ends or the monitor stops.
func (w *Watcher) start(parent context.Context, m Watched) *watch {
	ctx, cancel := context.WithCancel(parent)
	wt := &watch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(wt.done)
		defer cancel()
		if err := w.run(ctx, m); err != nil && !errors.Is(err, errStopped) && ctx.Err() == nil {
			w.log.Warn("monitor watch ended", "agent_id", m.AgentID, "monitor_id", m.MonitorID, "subject", m.Source.Value, "err", err)
		}
	}()
	return wt
}

func (w *Watcher) run(ctx context.Context, m Watched) error {
	lines := make(chan string, watchBuffer)
	var dropped atomic.Int64
	sub, err := w.cfg.NC.Subscribe(m.Source.Value, func(msg *nats.Msg) {
		// Cut here: a buffer of lines must not hold whole large payloads.
		line := CapLine(msg.Subject + " " + string(msg.Data[:min(len(msg.Data), 2*MaxLineBytes)]))
		select {
		case lines <- line:
		default:
			dropped.Add(1)
		}
	})
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	seq, err := w.nextSeq(ctx, m)
	if err != nil {
		return err
	}
	log := w.log.With("agent_id", m.AgentID, "monitor_id", m.MonitorID)
	log.Debug("watching a subject", "subject", m.Source.Value, "seq", seq)
	err = Gather(ctx, lines, func(ctx context.Context, batch []string) error {
		for n := 0; ; n++ {
			r, err := w.cfg.Store.emit(ctx, m.AgentID, m.MonitorID, seq, batch, dropped.Swap(0), SourceSubject)
			var wire *subjects.Error
			switch {
			case err == nil && r.Duplicate:
				// Another replica held the shard a moment too: go on
				// from where the record is.
				seq = r.NextSeq
				return nil
			case err == nil:
				seq = r.NextSeq
				if r.Status == Stopped {
					return errStopped
				}
				return nil
			case errors.Is(err, ErrMonitorStopped), errors.Is(err, ErrMonitorNotFound):
				return errStopped
			case errors.As(err, &wire) && wire.Code == CodeOutOfOrder:
				if seq, err = w.nextSeq(ctx, m); err != nil {
					return err
				}
				continue
			}
			log.Debug("batch not applied; retrying", "seq", seq, "err", err)
			if !backoff.Sleep(ctx, min(time.Duration(n+1)*200*time.Millisecond, 2*time.Second)) {
				return ctx.Err()
			}
		}
	})
	return err
}

// errStopped ends a watch whose monitor has stopped.
var errStopped = errors.New("monitor stopped")

// nextSeq reads the seq the monitor's next batch takes, retrying while
// the store is away.
func (w *Watcher) nextSeq(ctx context.Context, m Watched) (int64, error) {
	for n := 0; ; n++ {
		rec, _, err := w.cfg.Store.getRev(ctx, m.AgentID, m.MonitorID)
		if err == nil {
			if rec.Finished() {
				return 0, errStopped
			}
			return rec.NextSeq, nil
		}
		if errors.Is(err, ErrMonitorNotFound) {
			return 0, errStopped
		}
		if !backoff.Sleep(ctx, min(time.Duration(n+1)*200*time.Millisecond, 2*time.Second)) {
			return 0, ctx.Err()
		}
	}
}
