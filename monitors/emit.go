package monitors

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/chime-nats/chime/subjects"
)

// ActionEmit is the action an executor sends a source's lines with.
const ActionEmit = "monitor.emit"

// CodeOutOfOrder refuses a batch whose seq is past the next.
const CodeOutOfOrder = "monitor_emit_out_of_order"

// EmitRequest is the body of monitor.emit: batch seq (0, 1, 2... in
// order) of a monitor's source's lines.
type EmitRequest struct {
	MonitorID string   `json:"monitor_id"`
	Seq       *int64   `json:"seq"`
	Lines     []string `json:"lines"`
}

// Validate checks an emit.
func (r *EmitRequest) Validate() error {
	if err := subjects.ValidateID("monitor_id", r.MonitorID); err != nil {
		return err
	}
	switch {
	case r.Seq == nil:
		return subjects.Invalid("seq is required")
	case *r.Seq < 0:
		return subjects.Invalid(fmt.Sprintf("seq must not be negative, not %d", *r.Seq))
	case len(r.Lines) == 0:
		return subjects.Invalid("lines must not be empty")
	case len(r.Lines) > MaxBatchLines:
		return subjects.Invalid(fmt.Sprintf("lines must be at most %d a batch, not %d", MaxBatchLines, len(r.Lines)))
	}
	return nil
}

// DecodeEmit decodes a monitor.emit body.
func DecodeEmit(data []byte) (*EmitRequest, error) {
	var r EmitRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	return &r, r.Validate()
}

// EmitReply says what became of a batch, and where the monitor is.
type EmitReply struct {
	MonitorID string `json:"monitor_id"`
	// NextSeq is the seq of the next batch to send.
	NextSeq int64  `json:"next_seq"`
	Status  Status `json:"status"`
	// StopReason is set once the monitor has stopped (this batch may
	// have stopped it): the executor then stops its command.
	StopReason string `json:"stop_reason,omitempty"`
	// Delivered, Suppressed and Filtered count this batch's lines.
	Delivered  int   `json:"delivered"`
	Suppressed int64 `json:"suppressed,omitempty"`
	Filtered   int64 `json:"filtered,omitempty"`
	// Duplicate says the batch was applied before (a retry).
	Duplicate bool `json:"duplicate,omitempty"`
	// Superseded says the seq holds another batch, stored by an earlier
	// attempt whose count never reached the record (a crash, a watch
	// that moved): that one is counted now, and this one was not
	// delivered; send it again as NextSeq.
	Superseded bool `json:"superseded,omitempty"`
}

// MonitorStoppedError is the refusal of lines for a stopped monitor.
func MonitorStoppedError(m *Monitor) *subjects.Error {
	return &subjects.Error{Code: CodeMonitorStopped, Message: fmt.Sprintf("monitor %s stopped (%s)", m.ID, m.StopReason), Status: 409}
}

// Emit applies batch seq of a running monitor's lines: filtered, capped
// and paced (Apply), delivered as one monitor_event under the stable ID
// monitor_<id>_<seq>, then counted in the record by CAS. A batch sent
// again is answered as applied and delivered nothing more: before the
// record counts it, the inbox's dedup drops the repeat; after, its seq is
// behind the record's.
func (s *Store) Emit(ctx context.Context, agentID string, req *EmitRequest) (*EmitReply, error) {
	return s.emit(ctx, agentID, req.MonitorID, *req.Seq, req.Lines, 0, SourceCommand, "")
}

// emit is Emit for batch seq of lines of a monitor whose source is of
// type from, dropped lines before it counted as suppressed; cursor, when
// set, is the source's position after the batch, stored with its count.
func (s *Store) emit(ctx context.Context, agentID, id string, seq int64, lines []string, dropped int64, from, cursor string) (*EmitReply, error) {
	cur, rev, err := s.getRev(ctx, agentID, id)
	if err != nil {
		return nil, err
	}
	if cur.Source.Type != from {
		// A subject's lines are chime's to send: an agent's would race
		// the watch for its seqs.
		return nil, subjects.Invalid(fmt.Sprintf("monitor %s watches a %s: chime sends its lines, monitor.emit is for command monitors", cur.ID, cur.Source.Type))
	}
	switch {
	case seq < cur.NextSeq:
		return &EmitReply{MonitorID: cur.ID, NextSeq: cur.NextSeq, Status: cur.Status, StopReason: cur.StopReason, Duplicate: true}, nil
	case cur.Finished():
		return nil, MonitorStoppedError(cur)
	case seq > cur.NextSeq:
		return nil, &subjects.Error{Code: CodeOutOfOrder, Status: 409,
			Message: fmt.Sprintf("batch %d of monitor %s is out of order: the next is %d", seq, cur.ID, cur.NextSeq)}
	}
	now := s.now()
	next := *cur
	if cur.Bucket != nil {
		b := *cur.Bucket
		next.Bucket = &b
	}
	before := next
	batch, stop := Apply(&next, seq, lines, dropped, now, s.pace)
	batch.Cursor = cursor
	if !batch.Empty() {
		env := EventEnvelope(&next, &batch, now)
		ack, err := s.inbox.DeliverOnce(ctx, &env, now)
		if err != nil {
			return nil, fmt.Errorf("monitors: deliver batch %d of %s: %w", seq, cur.ID, err)
		}
		if ack.Duplicate {
			stored, err := s.storedBatch(ctx, ack.Sequence)
			if err != nil {
				return nil, fmt.Errorf("monitors: read the stored batch %d of %s: %w", seq, cur.ID, err)
			}
			if !slices.Equal(stored.Lines, batch.Lines) || stored.Cursor != batch.Cursor {
				return s.adopt(ctx, agentID, cur, rev, stored)
			}
		}
	}
	applied := false
	m, rev, err := s.update(ctx, agentID, cur.ID, func(m *Monitor) (bool, error) {
		if applied = m.NextSeq == seq; !applied {
			return false, nil // applied by a concurrent retry, or another watch
		}
		m.Events, m.Batches, m.Filtered, m.Suppressed, m.PendingSuppressed = next.Events, next.Batches, next.Filtered, next.Suppressed, next.PendingSuppressed
		m.NextSeq, m.LastEventAt, m.Bucket, m.FloodSince = next.NextSeq, next.LastEventAt, next.Bucket, next.FloodSince
		if cursor != "" {
			m.Cursor = cursor
		}
		if stop != "" && !m.Finished() {
			at := now.UTC()
			m.Status, m.StoppedAt, m.StopReason = Stopped, &at, stop
		}
		return true, nil
	}, cur, rev)
	if err != nil {
		return nil, err
	}
	if m.Finished() {
		if m, err = s.settle(ctx, m, rev); err != nil {
			return nil, err
		}
	}
	if !applied {
		// Another attempt counted this seq first: a source with cursors
		// goes on from the record, not from where this batch ended.
		return &EmitReply{MonitorID: m.ID, NextSeq: m.NextSeq, Status: m.Status, StopReason: m.StopReason, Duplicate: true}, nil
	}
	return &EmitReply{
		MonitorID: m.ID, NextSeq: m.NextSeq, Status: m.Status, StopReason: m.StopReason,
		Delivered: len(batch.Lines), Suppressed: next.Suppressed - before.Suppressed, Filtered: next.Filtered - before.Filtered,
	}, nil
}

// storedBatch reads the monitor_event the inbox holds at seq.
func (s *Store) storedBatch(ctx context.Context, seq uint64) (*storedEvent, error) {
	env, err := s.inbox.StoredEnvelope(ctx, seq)
	if err != nil {
		return nil, err
	}
	var d EventData
	if err := json.Unmarshal(env.Data, &d); err != nil {
		return nil, fmt.Errorf("envelope %s: %w", env.ID, err)
	}
	return &storedEvent{EventData: d, At: env.At}, nil
}

// storedEvent is a batch as the inbox holds it.
type storedEvent struct {
	EventData
	At time.Time
}

// adopt counts in the record the batch stored under the record's next seq
// by an earlier attempt that never counted it (a crash between the store
// and the CAS, or a watch that moved meanwhile): the agent has that batch,
// so the record takes its lines, suppressed count and cursor, and the
// caller's batch, not delivered, goes again as the next seq (an in-chime
// source with a cursor resumes from the stored one instead). The bucket
// is charged for the stored lines at their time; what the earlier attempt
// filtered is not known and is not counted.
func (s *Store) adopt(ctx context.Context, agentID string, cur *Monitor, rev uint64, st *storedEvent) (*EmitReply, error) {
	seq := st.Seq
	m, rev, err := s.update(ctx, agentID, cur.ID, func(m *Monitor) (bool, error) {
		if m.NextSeq != seq || m.Finished() {
			return false, nil // moved on meanwhile
		}
		n := int64(len(st.Lines))
		if m.Bucket != nil {
			b := *m.Bucket
			m.Bucket = &b
		}
		m.take(int(n), st.At, s.pace)
		m.Events, m.Batches, m.NextSeq = m.Events+n, m.Batches+1, seq+1
		at := st.At.UTC()
		m.LastEventAt = &at
		if st.Suppressed > 0 {
			m.Suppressed += max(st.Suppressed-m.PendingSuppressed, 0)
			m.PendingSuppressed = 0
		}
		if st.Cursor != "" {
			m.Cursor = st.Cursor
		}
		if m.MaxEvents > 0 && m.Events >= m.MaxEvents {
			now := s.now().UTC()
			m.Status, m.StoppedAt, m.StopReason = Stopped, &now, ReasonMaxEvents
		}
		return true, nil
	}, cur, rev)
	if err != nil {
		return nil, err
	}
	s.log.Info("monitor batch stored by an earlier attempt counted; this one goes again", "agent_id", agentID, "monitor_id", cur.ID, "seq", seq)
	if m.Finished() {
		if m, err = s.settle(ctx, m, rev); err != nil {
			return nil, err
		}
	}
	return &EmitReply{MonitorID: m.ID, NextSeq: m.NextSeq, Status: m.Status, StopReason: m.StopReason, Superseded: true}, nil
}

// SettleAfter is how long a stopped monitor's delivery is left to the
// request that stopped it before a sweep completes it.
const SettleAfter = 5 * time.Second

// Sweep stops the running monitors whose timeout or idle timeout has
// passed and completes deliveries a crash interrupted, as due lists them
// (the Index's Due). Every replica may sweep: each change is a CAS and
// each envelope has its stable ID. It returns how many it stopped.
func (s *Store) Sweep(ctx context.Context, due []Due) (int, error) {
	stopped := 0
	now := s.now()
	for _, d := range due {
		m, rev, err := s.getRev(ctx, d.AgentID, d.MonitorID)
		if err != nil {
			if ctx.Err() != nil {
				return stopped, err
			}
			continue // gone: the watch catches up
		}
		reason := ""
		switch {
		case m.Finished():
			if m.DeliveredAt == nil && m.StoppedAt != nil && now.Sub(*m.StoppedAt) >= SettleAfter {
				if _, err := s.settle(ctx, m, rev); err != nil {
					s.log.Warn("monitor end not delivered; the next sweep retries", "agent_id", m.AgentID, "monitor_id", m.ID, "err", err)
				}
			}
			continue
		case m.ExpiresAt != nil && !now.Before(*m.ExpiresAt):
			reason = ReasonTimeout
		case !m.IdleDeadline().IsZero() && !now.Before(m.IdleDeadline()):
			reason = ReasonIdleTimeout
		default:
			continue
		}
		if _, err := s.end(ctx, m.AgentID, m.ID, reason, nil, m, rev); err != nil {
			s.log.Warn("monitor not stopped; the next sweep retries", "agent_id", m.AgentID, "monitor_id", m.ID, "reason", reason, "err", err)
			continue
		}
		stopped++
	}
	return stopped, nil
}
