package monitors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/subjects"
)

// Admission admits a new monitor of an agent's: the per-agent limit,
// which quotas.Quotas owns.
type Admission interface {
	// Monitor admits one more live monitor for an agent that has live.
	Monitor(agentID string, live int) error
}

// Counter counts an agent's live monitors (the Index).
type Counter interface {
	Running(agentID string) int
	// WaitSeen returns once the count includes the bucket's revision rev.
	WaitSeen(ctx context.Context, rev uint64) error
}

// seenWithin bounds how long a start or stop waits for the count to hold
// its own write, so that the agent's next start on this replica is
// counted against it; past it the reply goes anyway.
const seenWithin = 2 * time.Second

// counted waits, within seenWithin, until the count holds revision rev.
func (s *Store) counted(ctx context.Context, rev uint64) {
	if s.count == nil || rev == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, seenWithin)
	defer cancel()
	if err := s.count.WaitSeen(ctx, rev); err != nil {
		s.log.Debug("monitor count behind its own write", "revision", rev, "err", err)
	}
}

// Config says what a Store works on.
type Config struct {
	KV        jetstream.KeyValue // the monitors bucket
	JS        jetstream.JetStream
	Inbox     *consumer.Inbox
	Now       func() time.Time
	Retention kvrec.Retention
	Log       *slog.Logger
	// Admit and Count, when both set, bound an agent's live monitors.
	Admit Admission
	Count Counter
	// Pace is how a monitor's events are paced (zero: DefaultPace).
	Pace Pace
	// Sources are the source types served besides command, each with
	// what an agent may watch of it (the subject type's SubjectPolicy, the
	// kv type's KVPolicy, also a Starter):
	// a type absent is refused monitor_source_not_served.
	Sources map[string]Checker
}

// Store reads and writes monitors.
type Store struct {
	kv        jetstream.KeyValue
	js        jetstream.JetStream
	inbox     *consumer.Inbox
	now       func() time.Time
	retention kvrec.Retention
	log       *slog.Logger
	admit     Admission
	count     Counter
	pace      Pace
	sources   map[string]Checker
}

// NewStore returns a Store.
func NewStore(c Config) *Store {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Pace == (Pace{}) {
		c.Pace = DefaultPace()
	}
	return &Store{kv: c.KV, js: c.JS, inbox: c.Inbox, now: c.Now, retention: c.Retention, log: c.Log.With("component", "monitors"),
		admit: c.Admit, count: c.Count, pace: c.Pace, sources: c.Sources}
}

// Start registers a running monitor. A start naming a monitor_id the
// agent has already answers its record as it is (a retry).
func (s *Store) Start(ctx context.Context, agentID string, spec *Spec) (*Monitor, error) {
	if err := s.served(agentID, spec.Source); err != nil {
		return nil, err
	}
	id := spec.MonitorID
	if id == "" {
		id = NewID()
	} else {
		m, _, err := kvrec.Get[Monitor](ctx, s.kv, Key(agentID, id))
		if err == nil {
			return m, nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("monitors: start %s: %w", id, err)
		}
	}
	if s.admit != nil && s.count != nil {
		if err := s.admit.Monitor(agentID, s.count.Running(agentID)); err != nil {
			return nil, err
		}
	}
	cursor := ""
	if st, ok := s.sources[spec.Source.Type].(Starter); ok {
		var err error
		if cursor, err = st.Start(ctx, agentID, spec.Source.Value); err != nil {
			return nil, err
		}
	}
	now := s.now().UTC()
	m := &Monitor{
		ID: id, AgentID: agentID, Description: spec.Description, Source: spec.Source, Match: spec.Match, Exclude: spec.Exclude,
		Persistent: spec.Persistent, MaxEvents: spec.MaxEvents, IdleTimeoutMS: spec.IdleTimeout.Milliseconds(), IntervalMS: spec.Interval.Milliseconds(),
		Status: Running, CreatedAt: now, Bucket: &Bucket{Tokens: float64(s.pace.Burst), At: now}, Cursor: cursor,
	}
	if !spec.Persistent {
		m.TimeoutMS = spec.Timeout.Milliseconds()
		at := now.Add(spec.Timeout)
		m.ExpiresAt = &at
	}
	stored, rev, err := kvrec.Create(ctx, s.kv, Key(agentID, id), m, func(*Monitor) bool { return true })
	if err != nil {
		return nil, fmt.Errorf("monitors: start %s: %w", id, err)
	}
	s.counted(ctx, rev)
	return stored, nil
}

// served returns why agentID may not watch src here, or nil.
func (s *Store) served(agentID string, src Source) error {
	if src.Type == SourceCommand {
		return nil
	}
	c, ok := s.sources[src.Type]
	if !ok {
		served := []string{SourceCommand + " (chime monitor run)"}
		for _, t := range []string{SourceSubject, SourceKV, SourceWS, SourceHTTP} {
			if _, ok := s.sources[t]; ok {
				served = append(served, t)
			}
		}
		return &subjects.Error{Code: CodeSourceNotServed, Status: 501,
			Message: fmt.Sprintf("monitors of a %s are not served yet: %s are", src.Type, strings.Join(served, ", "))}
	}
	return c.Check(agentID, src.Value)
}

// Get returns one of the agent's monitors, completing the delivery of
// its end if a crash interrupted it.
func (s *Store) Get(ctx context.Context, agentID, id string) (*Monitor, error) {
	m, rev, err := s.getRev(ctx, agentID, id)
	if err != nil {
		return nil, err
	}
	return s.settle(ctx, m, rev)
}

func (s *Store) getRev(ctx context.Context, agentID, id string) (*Monitor, uint64, error) {
	m, rev, err := kvrec.Get[Monitor](ctx, s.kv, Key(agentID, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, MonitorNotFound(id)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("monitors: get %s: %w", id, err)
	}
	return m, rev, nil
}

// List returns a page of the agent's monitors, running and stopped (a
// stopped one is kept for the record retention).
func (s *Store) List(ctx context.Context, agentID string, limit int, from subjects.CursorPos) ([]Monitor, subjects.CursorPos, error) {
	pg, err := kvrec.ListPage[Monitor](ctx, s.js, []string{s.kv.Bucket()}, agentID+".*", kvrec.Pos(from), limit, nil)
	if errors.Is(err, kvrec.ErrPos) {
		return nil, subjects.CursorPos{}, subjects.ErrCursorStale()
	}
	if err != nil {
		return nil, subjects.CursorPos{}, fmt.Errorf("monitors: list: %w", err)
	}
	return pg.Items, subjects.CursorPos(pg.Next), nil
}

// update changes a monitor by CAS; a stopped one expires after the
// retention. cur, at rev, spares the first attempt a read.
func (s *Store) update(ctx context.Context, agentID, id string, change func(*Monitor) (bool, error), cur *Monitor, rev uint64) (*Monitor, uint64, error) {
	opts := []kvrec.Option[Monitor]{kvrec.ExpireFinished(s.retention, (*Monitor).Finished)}
	if cur != nil && rev > 0 {
		cp := *cur
		opts = append(opts, kvrec.Current(&cp, rev))
	}
	m, rev, _, err := kvrec.UpdateRev(ctx, s.kv, Key(agentID, id), false, change, opts...)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, MonitorNotFound(id)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("monitors: update %s: %w", id, err)
	}
	return m, rev, nil
}

// Stop stops a running monitor: reason stopped, or source_ended with the
// executor's exit code. A stopped monitor is answered as it is.
func (s *Store) Stop(ctx context.Context, agentID string, req *StopRequest) (*Monitor, error) {
	reason := ReasonStopped
	if req.ExitCode != nil {
		reason = ReasonSourceEnded
	}
	return s.end(ctx, agentID, req.MonitorID, reason, req.ExitCode, nil, 0)
}

// end stops a monitor for reason and delivers its monitor_stopped.
func (s *Store) end(ctx context.Context, agentID, id, reason string, exitCode *int, cur *Monitor, rev uint64) (*Monitor, error) {
	if cur == nil {
		var err error
		if cur, rev, err = s.getRev(ctx, agentID, id); err != nil {
			return nil, err
		}
	}
	m, rev, err := s.update(ctx, agentID, id, func(m *Monitor) (bool, error) {
		if m.Finished() {
			return false, nil
		}
		at := s.now().UTC()
		m.Status, m.StoppedAt, m.StopReason, m.ExitCode = Stopped, &at, reason, exitCode
		return true, nil
	}, cur, rev)
	if err != nil {
		return nil, err
	}
	s.counted(ctx, rev)
	return s.settle(ctx, m, rev)
}

// settle completes a stopped monitor's delivery: the envelope stored
// under its stable ID, then delivered_at written. Idempotent, so any
// caller on any replica may repeat it.
func (s *Store) settle(ctx context.Context, m *Monitor, rev uint64) (*Monitor, error) {
	if !m.Finished() || m.DeliveredAt != nil {
		return m, nil
	}
	env := StoppedEnvelope(m)
	if _, err := s.inbox.DeliverOnce(ctx, &env, *m.StoppedAt); err != nil {
		return nil, fmt.Errorf("monitors: deliver the end of %s: %w", m.ID, err)
	}
	at := s.now().UTC()
	out, _, err := s.update(ctx, m.AgentID, m.ID, func(m *Monitor) (bool, error) {
		if m.DeliveredAt != nil {
			return false, nil
		}
		m.DeliveredAt = &at
		return true, nil
	}, m, rev)
	return out, err
}
