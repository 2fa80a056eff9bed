package monitors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

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
	Store  *Store
	Index  *Index
	Leases Owner
	Shards int
	Log    *slog.Logger
	// Every is how often the watches are matched to the shards held and
	// the running monitors (default 500 ms).
	Every time.Duration
	// Feeds are the sources watched in chime, by type (SourceSubject:
	// a SubjectFeed).
	Feeds map[string]Feed
}

// Watcher runs the monitors of in-chime sources (its Feeds) of the shards
// this replica holds: each Feed's lines are gathered into batches
// (Gather) and applied with the store's emit, as an executor's would be,
// with the Feed's cursor stored by the same CAS, so that the next holder
// of the shard resumes where the record says. A Feed that ends by itself
// stops its monitor (source_ended) once its last lines are applied.
type Watcher struct {
	cfg     WatcherConfig
	log     *slog.Logger
	mu      sync.Mutex
	watches map[string]*watch // record key -> its watch
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

// watch is one running monitor of an in-chime source.
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

// Watching is how many monitors this replica watches.
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
	for typ := range w.cfg.Feeds {
		for _, m := range w.cfg.Index.RunningOf(typ) {
			if owned[partitions.ShardOf(m.Key, len(owned))] {
				want[m.Key] = m
			}
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
		err := w.run(ctx, m)
		switch {
		case errors.Is(err, errResync):
			w.log.Debug("monitor watch resyncs from its record", "agent_id", m.AgentID, "monitor_id", m.MonitorID)
		case err != nil && !errors.Is(err, errStopped) && ctx.Err() == nil:
			w.log.Warn("monitor watch ended", "agent_id", m.AgentID, "monitor_id", m.MonitorID, "source", m.Source.Type, "value", m.Source.logged(), "err", err)
		}
	}()
	return wt
}

func (w *Watcher) run(ctx context.Context, m Watched) error {
	feed, ok := w.cfg.Feeds[m.Source.Type]
	if !ok {
		return nil
	}
	rec, err := w.record(ctx, m)
	if err != nil {
		return err
	}
	log := w.log.With("agent_id", m.AgentID, "monitor_id", m.MonitorID)
	log.Debug("watching a source", "source", m.Source.Type, "value", m.Source.logged(), "seq", rec.NextSeq, "cursor", rec.Cursor)
	sink := newSink(watchBuffer)
	feedCtx, stopFeed := context.WithCancel(ctx)
	defer stopFeed()
	fed := make(chan error, 1)
	go func() {
		err := feed.Run(feedCtx, rec, sink)
		sink.close()
		fed <- err
	}()
	seq := rec.NextSeq
	err = Gather(ctx, sink.items, func(ctx context.Context, batch []Item) error {
		lines := make([]string, len(batch))
		for i, it := range batch {
			lines[i] = it.Line
		}
		cursor := batch[len(batch)-1].Cursor
		for n := 0; ; n++ {
			r, err := w.cfg.Store.emit(ctx, m.AgentID, m.MonitorID, seq, lines, sink.dropped.Swap(0), m.Source.Type, cursor)
			var wire *subjects.Error
			switch {
			case err == nil && r.Status == Stopped:
				return errStopped
			case err == nil && r.Superseded && cursor != "":
				return errResync // from the stored batch's cursor
			case err == nil && r.Superseded:
				seq = r.NextSeq // these lines go again, as the next batch
				continue
			case err == nil && r.Duplicate && cursor != "":
				return errResync
			case err == nil && r.Duplicate:
				// Another replica held the shard a moment too: a source
				// without cursors goes on from where the record is.
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
				if cursor != "" {
					return errResync
				}
				rec, err := w.record(ctx, m)
				if err != nil {
					return err
				}
				seq = rec.NextSeq
				continue
			}
			log.Debug("batch not applied; retrying", "seq", seq, "err", err)
			if !backoff.Sleep(ctx, min(time.Duration(n+1)*200*time.Millisecond, 2*time.Second)) {
				return ctx.Err()
			}
		}
	})
	stopFeed()
	ferr := <-fed
	var ended *SourceEnded
	switch {
	case err != nil:
		return err
	case errors.As(ferr, &ended):
		// Every line it sent is applied (Gather returned on the closed
		// sink): now the monitor ends, once, whichever replica says so.
		log.Info("monitor source ended", "source", m.Source.Type, "why", ended.Why)
		return w.ended(ctx, m, ended)
	case ferr != nil && ctx.Err() == nil:
		return fmt.Errorf("monitors: %s source: %w", m.Source.Type, ferr)
	}
	return nil
}

// ended stops m for its source's end, retrying while the store is away.
func (w *Watcher) ended(ctx context.Context, m Watched, e *SourceEnded) error {
	for n := 0; ; n++ {
		cur, rev, err := w.cfg.Store.getRev(ctx, m.AgentID, m.MonitorID)
		if err == nil {
			if cur.Finished() {
				return errStopped
			}
			if _, err = w.cfg.Store.end(ctx, m.AgentID, m.MonitorID, ReasonSourceEnded, e.Code, cur, rev); err == nil {
				return errStopped
			}
		}
		if errors.Is(err, ErrMonitorNotFound) {
			return errStopped
		}
		if !backoff.Sleep(ctx, min(time.Duration(n+1)*200*time.Millisecond, 2*time.Second)) {
			return ctx.Err()
		}
	}
}

// errStopped ends a watch whose monitor has stopped.
var errStopped = errors.New("monitor stopped")

// record reads the monitor's record, where its next batch starts,
// retrying while the store is away.
func (w *Watcher) record(ctx context.Context, m Watched) (*Monitor, error) {
	for n := 0; ; n++ {
		rec, _, err := w.cfg.Store.getRev(ctx, m.AgentID, m.MonitorID)
		if err == nil {
			if rec.Finished() {
				return nil, errStopped
			}
			return rec, nil
		}
		if errors.Is(err, ErrMonitorNotFound) {
			return nil, errStopped
		}
		if !backoff.Sleep(ctx, min(time.Duration(n+1)*200*time.Millisecond, 2*time.Second)) {
			return nil, ctx.Err()
		}
	}
}
