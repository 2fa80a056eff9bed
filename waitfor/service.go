package waitfor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/internal/schedule"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/timers"
)

// TaskState is what WaitFor needs to know of a task.
type TaskState struct {
	AgentID  string // its owner
	Terminal bool   // its result is reported
	// ResultEnvelopeID is the ID of its task_result envelope, once terminal.
	ResultEnvelopeID string
	// ResultConsumed says the agent has taken that result already.
	ResultConsumed bool
}

// TaskLookup finds tasks. Tasks are another package's; this is the one
// question WaitFor asks of them.
type TaskLookup interface {
	// LookupTask returns the task taskID, looked up for agentID; nil when
	// no agent has it. It must report Terminal no later than the task's
	// task_result envelope is stored.
	LookupTask(ctx context.Context, agentID, taskID string) (*TaskState, error)
}

// MonitorLookup finds monitors: the one question WaitFor asks of them.
// *monitors.Store answers it. An interface of plain values, not the
// store: the monitors package links the NATS server's subject functions,
// and agents' clients, which link this package, must not.
type MonitorLookup interface {
	// Finished reports whether the agent's monitor monitorID has stopped,
	// and why; an unknown one is an error of code CodeMonitorNotFound.
	Finished(ctx context.Context, agentID, monitorID string) (stopped bool, reason string, err error)
}

// Config configures a Service.
type Config struct {
	Store *Store
	// Timers checks a timer resource.
	Timers *timers.Store
	// Tasks checks a task resource; nil skips the check.
	Tasks TaskLookup
	// Monitors checks a monitor resource; nil skips the check.
	Monitors MonitorLookup
	Inbox    *consumer.Inbox
	JS       jetstream.JetStream
	// InboxStream, EventsStream: where envelopes and interventions are.
	InboxStream, EventsStream string
	Now                       func() time.Time
	Log                       *slog.Logger
}

// Service serves WaitFor, its report and system wakes, and resumes
// registrations for the consumer.
type Service struct {
	cfg Config
	log *slog.Logger
}

// NewService returns the WaitFor service.
func NewService(c Config) *Service {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: c, log: c.Log.With("component", "waitfor")}
}

// scheduleTTL is how long a delivered recheck event stays in its stream.
const scheduleTTL = "1h"

// catchUpLimit bounds the envelopes one catch-up reads: a turn's worth.
const catchUpLimit = 1000

// WaitFor registers a WaitFor (or, for delivery=final, prepares it for its
// report) and says how the agent goes on.
func (s *Service) WaitFor(ctx context.Context, agentID string, spec *WaitForSpec) (*WaitForReply, error) {
	return s.register(ctx, agentID, spec)
}

// WaitTasks registers a task_result WaitFor over a set of tasks (mode all
// or any): each result is delivered under its own task ID as ever, and
// the registration's one wait_woken once the set is satisfied.
func (s *Service) WaitTasks(ctx context.Context, agentID string, spec *WaitForSpec) (*WaitForReply, error) {
	if spec.Wake != WakeTaskResult || len(spec.Resources) == 0 {
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "task_ids must not be empty"}
	}
	return s.register(ctx, agentID, spec)
}

// register makes a registration of either kind.
func (s *Service) register(ctx context.Context, agentID string, spec *WaitForSpec) (*WaitForReply, error) {
	now := s.cfg.Now().UTC()
	w := &WaitFor{
		ID: "wf_" + nuid.Next(), AgentID: agentID, Wake: spec.Wake, Resource: spec.Resource, Reason: spec.Reason,
		Delivery: spec.Delivery, WorkItemID: spec.WorkItemID, Scope: ScopeAgent,
		RecheckAfterMs: spec.RecheckAfter.Milliseconds(), Status: WaitForActive, CreatedAt: now, UpdatedAt: now,
		Resources: spec.Resources, Mode: spec.Mode,
	}
	if w.WorkItemID != "" {
		w.Scope = ScopeWorkItem
	}
	// Read before the resource is: an envelope stored later is caught up on.
	since, err := s.lastSeq(ctx, s.cfg.InboxStream, "")
	if err != nil {
		return nil, err
	}
	w.SinceSeq = since
	// queuedBy is the result already in the inbox, not yet consumed, that
	// satisfies the wait; consumedBy the one the agent has consumed
	// already when no queued one does.
	var queuedBy, consumedBy *WakeCause
	switch {
	case w.Wake == WakeTimer:
		if w.AfterFire, err = s.checkTimer(ctx, agentID, w.Resource); err != nil {
			return nil, err
		}
	case w.Wake == WakeMonitor:
		// Checked after since is read: an event or end stored after this
		// check is stored after since too, and wakes the registration.
		if err := s.checkMonitor(ctx, agentID, w.Resource); err != nil {
			return nil, err
		}
	case w.Wake == WakeTaskResult && len(w.Resources) > 0:
		if queuedBy, consumedBy, err = s.checkTasks(ctx, w); err != nil {
			return nil, err
		}
	case w.Wake == WakeTaskResult:
		task, err := s.checkTask(ctx, agentID, w.Resource)
		if err != nil {
			return nil, err
		}
		if task != nil && task.Terminal {
			cause := &WakeCause{Kind: subjects.KindTaskResult, EnvelopeID: task.ResultEnvelopeID,
				Source: subjects.Source{Type: "task", ID: w.Resource}}
			if task.ResultConsumed {
				consumedBy = cause
			} else {
				queuedBy = cause
			}
		}
	}
	if consumedBy != nil && queuedBy == nil {
		// Holon: the result was taken already and will not come again;
		// nothing is registered and the agent goes on.
		r := &WaitForReply{Continuation: ContinueTurn, Disposition: DispositionTaskResultAlreadyConsumed,
			TaskID: consumedBy.Source.ID, ResultMessageID: consumedBy.EnvelopeID}
		if len(w.Resources) > 0 {
			r.TaskIDs, r.Mode, r.SeenTaskIDs = w.Resources, w.Mode, w.Seen
		}
		return r, nil
	}
	queued := queuedBy != nil
	if w.Delivery == DeliveryFinal && !queued {
		w.Status = WaitForPrepared
		if w.InterventionSeq, err = s.lastSeq(ctx, s.cfg.EventsStream, subjects.InterventionApply(agentID)); err != nil {
			return nil, err
		}
	}
	if queued {
		// Holon's task_result_queued: the exact result is in the inbox
		// already and is what re-enters the agent. The WaitFor is kept as
		// triggered by it (it replaces its scope's older one, as Holon's
		// triggered wait condition does) but never live: no wait is
		// registered, and no wait_woken follows the result. Whatever the
		// delivery: there is no wait to report on.
		w.Status, w.WokenBy, w.EndedAt, w.Reentered = WaitForWoken, queuedBy, &now, true
	}
	if err := s.cfg.Store.create(ctx, w); err != nil {
		return nil, err
	}
	replaced, err := s.replaceOlder(ctx, w)
	if err != nil {
		return nil, err
	}
	indexed := time.Now() // its index entry is written (monotonic: see presenceWindow)
	reply := replyFor(w)
	reply.CancelledWaitConditionIDs = replaced
	switch {
	case w.Status == WaitForPrepared:
		reply.Continuation, reply.Disposition, reply.ExpectedOutput = ContinueTurn, DispositionAwaitingFinalReport, "final_text_only"
	case queued:
		// Ended already: out of the scope index, so that no envelope is
		// matched against it (the result itself may be stored just now).
		if err := s.cfg.Store.unindex(ctx, w, 0); err != nil {
			return nil, err
		}
		reply.Continuation, reply.Disposition, reply.TaskID, reply.ResultMessageID = YieldAndReenter,
			DispositionTaskResultQueued, queuedBy.Source.ID, queuedBy.EnvelopeID
		reply.WaitRegistered = false
	default:
		if w, err = s.activated(ctx, w, indexed); err != nil {
			return nil, err
		}
		reply = replyFor(w)
		reply.CancelledWaitConditionIDs = replaced
	}
	return reply, nil
}

// replyFor is the reply of a registration made or committed.
func replyFor(w *WaitFor) *WaitForReply {
	r := &WaitForReply{
		WaitID: w.ID, Continuation: YieldAndWait, Disposition: DispositionRegistered,
		WaitRegistered: w.Status != WaitForPrepared, Scope: w.Scope, Wake: string(w.Wake), Resource: w.Resource,
		WorkItemID: w.WorkItemID, Reason: w.Reason, RecheckAfterMs: w.RecheckAfterMs, Status: string(w.Status),
		TaskIDs: w.Resources, Mode: w.Mode, SeenTaskIDs: w.Seen,
	}
	if w.RecheckAt != nil {
		r.RecheckAt = subjects.FormatISO(*w.RecheckAt)
	}
	return r
}

// replaceOlder makes w its scope's live registration and ends the one it
// replaces (Holon's wait_for_replaced).
func (s *Service) replaceOlder(ctx context.Context, w *WaitFor) ([]string, error) {
	old, err := s.cfg.Store.swap(ctx, w)
	if err != nil || old == "" {
		return nil, err
	}
	ended, changed, err := s.cfg.Store.update(ctx, w.AgentID, old, func(o *WaitFor) (bool, error) {
		return end(o, WaitForCancelled, EndWaitForReplaced, w.ID, s.cfg.Now()), nil
	})
	if errors.Is(err, ErrWaitForNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if changed || (ended.EndReason == EndWaitForReplaced && ended.ReplacedBy == w.ID) {
		return []string{old}, nil
	}
	return nil, nil
}

// Report commits a prepared delivery=final WaitFor with its final report:
// only if it is still prepared (no newer WaitFor replaced it) and no
// operator message was stored for the agent since it was prepared.
func (s *Service) Report(ctx context.Context, agentID string, req *WaitReportRequest) (*WaitForReply, error) {
	w, err := s.cfg.Store.Get(ctx, agentID, req.WaitID)
	if err != nil {
		return nil, err
	}
	if w.Status == WaitForPrepared {
		interjected, err := s.interjected(ctx, w)
		if err != nil {
			return nil, err
		}
		if interjected {
			if w, _, err = s.cfg.Store.update(ctx, agentID, w.ID, func(w *WaitFor) (bool, error) {
				return invalidate(w, s.cfg.Now()), nil
			}); err != nil {
				return nil, err
			}
			if err := s.cfg.Store.unindex(ctx, w, 0); err != nil {
				return nil, err
			}
			return nil, reportRefused(w)
		}
	}
	w, _, err = s.cfg.Store.update(ctx, agentID, w.ID, func(w *WaitFor) (bool, error) {
		return commit(w, req.Text, s.cfg.Now())
	})
	if err != nil {
		return nil, err
	}
	if w.Status == WaitForActive {
		// Its index entry was written before now, maybe just now.
		if w, err = s.activated(ctx, w, time.Now()); err != nil {
			return nil, err
		}
	}
	return replyFor(w), nil
}

// interjected reports whether an operator message (or stop) for the agent
// was stored after w was prepared.
func (s *Service) interjected(ctx context.Context, w *WaitFor) (bool, error) {
	found := false
	err := s.scan(ctx, s.cfg.EventsStream, subjects.InterventionApply(w.AgentID), w.InterventionSeq+1, func(m *jetstream.RawStreamMsg) bool {
		var iv interventions.Intervention
		if json.Unmarshal(m.Data, &iv) == nil && (iv.Action == interventions.ActionMessage || iv.Action == interventions.ActionStop) {
			found = true
		}
		return found
	})
	return found, err
}

// activated finishes a registration that became active, whose index
// entry was written by indexed: its recheck is scheduled, and the
// envelopes stored since it was made are matched, as the consumer may
// have passed them before it was live. The catch-up waits until
// presenceWindow after indexed, so that an envelope it does not see finds
// the entry in every view that passes envelopes over unread (Absent).
func (s *Service) activated(ctx context.Context, w *WaitFor, indexed time.Time) (*WaitFor, error) {
	if w.RecheckAfterMs > 0 && w.RecheckAt == nil {
		var err error
		if w, _, err = s.cfg.Store.update(ctx, w.AgentID, w.ID, func(w *WaitFor) (bool, error) {
			if w.RecheckAt != nil || w.Status != WaitForActive {
				return false, nil
			}
			at := s.cfg.Now().UTC().Add(time.Duration(w.RecheckAfterMs) * time.Millisecond)
			w.RecheckAt = &at
			return true, nil
		}); err != nil {
			return nil, err
		}
	}
	if w.Status == WaitForActive && satisfied(w) {
		// A set satisfied at registration whose report came later: no
		// envelope still to come wakes it, so its last seen result does.
		return s.wakeSatisfied(ctx, w)
	}
	if w.RecheckAt != nil && w.Status == WaitForActive {
		if err := s.schedule(ctx, w); err != nil {
			return nil, err
		}
	}
	if wait := presenceWindow - time.Since(indexed); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waitfor: catch-up: %w", ctx.Err())
		}
	}
	return w, s.scan(ctx, s.cfg.InboxStream, subjects.Inbox(w.AgentID), w.SinceSeq+1, func(m *jetstream.RawStreamMsg) bool {
		var env subjects.Envelope
		if json.Unmarshal(m.Data, &env) != nil || !Matches(w, &env, m.Sequence) {
			return false
		}
		got, err := s.apply(ctx, Versioned{WaitFor: w}, &env, m.Sequence)
		if err != nil {
			s.log.Warn("catch-up wake; the consumer retries", "wait_id", w.ID, "err", err)
			return true
		}
		// A set takes several results: read on until it is woken.
		return len(w.Resources) == 0 || got == nil || got.Ended()
	})
}

// wakeSatisfied wakes an active set registration that was satisfied when
// it was made, by the result of the last task seen.
func (s *Service) wakeSatisfied(ctx context.Context, w *WaitFor) (*WaitFor, error) {
	last := w.Seen[len(w.Seen)-1]
	cause := WakeCause{Kind: subjects.KindTaskResult, EnvelopeID: tasks.TaskEnvelopeID(last), Source: subjects.Source{Type: "task", ID: last}}
	got, _, err := s.cfg.Store.update(ctx, w.AgentID, w.ID, func(w *WaitFor) (bool, error) {
		return wake(w, cause, s.cfg.Now()), nil
	})
	if err != nil {
		return nil, err
	}
	if got.Status == WaitForWoken && got.WokenBy != nil && got.WokenBy.EnvelopeID == cause.EnvelopeID {
		if err := s.deliverWoken(ctx, got); err != nil {
			return nil, err
		}
	}
	if got.Ended() {
		return got, s.cfg.Store.unindex(ctx, got, 0)
	}
	return got, nil
}

// schedule stores w's recheck as a message schedule: the engine publishes
// it to the recheck subject when due.
func (s *Service) schedule(ctx context.Context, w *WaitFor) error {
	m := schedule.At(subjects.WaitForSchedule(w.AgentID, w.ID), subjects.WaitForRecheck(w.AgentID, w.ID), *w.RecheckAt)
	m.Header.Set("Nats-Schedule-TTL", scheduleTTL)
	m.Header.Set(jetstream.MsgIDHeader, "schedule_"+w.ID)
	m.Data = []byte(w.ID)
	if _, err := consumer.Publish(ctx, s.cfg.JS, m); err != nil {
		return fmt.Errorf("waitfor: schedule recheck of %s: %w", w.ID, err)
	}
	return nil
}

// Apply applies the inbox envelope env (stored at seq) to the live
// registration w: a stop cancels it, an operator message invalidates it
// while it awaits its report, and its wake resumes it once and delivers
// its wait_woken. Repeats are absorbed.
func (s *Service) Apply(ctx context.Context, w *WaitFor, env *subjects.Envelope, seq uint64) error {
	_, err := s.apply(ctx, Versioned{WaitFor: w}, env, seq)
	return err
}

// apply is Apply, returning the registration as stored after it (nil when
// env changes nothing or it expired). A w read at a known revision is
// changed by CAS on it without reading it again.
func (s *Service) apply(ctx context.Context, w Versioned, env *subjects.Envelope, seq uint64) (*WaitFor, error) {
	now := s.cfg.Now
	var change func(*WaitFor) (bool, error)
	switch {
	case env.Kind == subjects.KindIntervention && interventionAction(env) == interventions.ActionStop && seq > w.SinceSeq:
		change = func(w *WaitFor) (bool, error) {
			return end(w, WaitForCancelled, EndAgentStopped, "", now()), nil
		}
	case operatorMessage(env) && w.Status == WaitForPrepared && seq > w.SinceSeq:
		change = func(w *WaitFor) (bool, error) { return invalidate(w, now()), nil }
	case Matches(w.WaitFor, env, seq):
		// A set member's result is seen, and wakes the set that it
		// satisfies; a duplicate result is seen already and absorbed.
		change = func(w *WaitFor) (bool, error) { return advance(w, env, now()), nil }
	default:
		return nil, nil
	}
	var got *WaitFor
	var err error
	if w.Rev > 0 {
		got, _, err = s.cfg.Store.updateFrom(ctx, w, change)
	} else {
		got, _, err = s.cfg.Store.update(ctx, w.AgentID, w.ID, change)
	}
	if errors.Is(err, ErrWaitForNotFound) {
		return nil, nil // expired
	}
	if err != nil {
		return nil, err
	}
	// A redelivery after a crash between the CAS and the delivery finds
	// it woken by this very envelope and delivers again: the envelope ID
	// keeps it single.
	if got.Status == WaitForWoken && got.WokenBy != nil && got.WokenBy.EnvelopeID == env.ID && !got.Reentered {
		if err := s.deliverWoken(ctx, got); err != nil {
			return nil, err
		}
	}
	if got.Ended() {
		return got, s.cfg.Store.unindex(ctx, got, w.indexRev)
	}
	return got, nil
}

// deliverWoken delivers a woken registration's one wait_woken envelope.
func (s *Service) deliverWoken(ctx context.Context, w *WaitFor) error {
	env := WaitWokenEnvelope(w)
	if _, err := s.cfg.Inbox.DeliverOnce(ctx, &env, env.At); err != nil {
		return fmt.Errorf("waitfor: deliver wait_woken of %s: %w", w.ID, err)
	}
	return nil
}

// Recheck delivers the due recheck of a registration once, unless it
// ended first.
func (s *Service) Recheck(ctx context.Context, agentID, waitID string) error {
	w, _, err := s.cfg.Store.update(ctx, agentID, waitID, func(w *WaitFor) (bool, error) {
		return markRecheck(w, s.cfg.Now()), nil
	})
	if errors.Is(err, ErrWaitForNotFound) {
		return nil
	}
	if err != nil || !w.RecheckSent || w.RecheckAt == nil {
		return err
	}
	env := RecheckEnvelope(w, *w.RecheckAt)
	if _, err := s.cfg.Inbox.DeliverOnce(ctx, &env, *w.RecheckAt); err != nil {
		return fmt.Errorf("waitfor: deliver recheck of %s: %w", w.ID, err)
	}
	return nil
}

// SystemWake delivers an operator's system_wake envelope; the consumer
// wakes the agent's system WaitFor from it.
func (s *Service) SystemWake(ctx context.Context, agentID string, req *SystemWakeRequest) (any, error) {
	env := SystemWakeEnvelope("system_wake_"+nuid.Next(), agentID, req.Text, s.cfg.Now())
	if _, err := s.cfg.Inbox.Deliver(ctx, &env); err != nil {
		return nil, fmt.Errorf("waitfor: system wake: %w", err)
	}
	return map[string]any{"ok": true, "id": env.ID}, nil
}

// checkTimer checks a timer resource with Holon's texts and returns its
// fire count: only a later fire wakes the registration.
func (s *Service) checkTimer(ctx context.Context, agentID, timerID string) (int64, error) {
	t, err := s.cfg.Timers.Get(ctx, agentID, timerID)
	if errors.Is(err, subjects.ErrTimerNotFound) {
		// Timers are keyed by agent; another agent's shows under its own.
		other, lerr := s.cfg.Timers.Someone(ctx, timerID)
		if lerr != nil {
			return 0, lerr
		}
		if other {
			return 0, &subjects.Error{Code: "timer_agent_mismatch", Message: "wait_for timer agent mismatch: " + timerID}
		}
		return 0, &subjects.Error{Code: subjects.CodeTimerNotFound, Message: "wait_for timer does not exist: " + timerID}
	}
	if err != nil {
		return 0, err
	}
	if t.Status != timers.TimerActive {
		return 0, &subjects.Error{Code: "timer_not_active", Message: "wait_for timer is not active: " + timerID}
	}
	return t.FireCount, nil
}

// checkMonitor checks a monitor resource through Monitors, when wired, in
// the timer's words: it must be the agent's (monitor IDs are per agent, so
// another agent's is not found) and running. A stopped one is refused
// rather than waited on: its monitor_stopped, its last envelope, is
// stored already (or is being stored by the stop, which may land after
// since and would then wake it at once): the agent reads that instead.
func (s *Service) checkMonitor(ctx context.Context, agentID, monitorID string) error {
	if s.cfg.Monitors == nil {
		return nil
	}
	stopped, reason, err := s.cfg.Monitors.Finished(ctx, agentID, monitorID)
	if errors.Is(err, &subjects.Error{Code: CodeMonitorNotFound}) {
		return &subjects.Error{Code: CodeMonitorNotFound, Message: "wait_for monitor does not exist: " + monitorID, Status: 404}
	}
	if err != nil {
		return fmt.Errorf("waitfor: monitor %s: %w", monitorID, err)
	}
	if stopped {
		return &subjects.Error{Code: CodeMonitorStopped, Status: 409,
			Message: fmt.Sprintf("wait_for monitor is stopped: %s (%s)", monitorID, reason)}
	}
	return nil
}

// checkTasks checks each task of a set as checkTask does and marks those
// already terminal seen: their results are in the inbox, or were taken
// from it. When the seen ones satisfy the set, it returns the result that
// re-enters the agent: the first of them still queued (queued), or, when
// the agent has consumed every one, the last of them (consumed).
func (s *Service) checkTasks(ctx context.Context, w *WaitFor) (queued, consumed *WakeCause, err error) {
	for _, id := range w.Resources {
		t, err := s.checkTask(ctx, w.AgentID, id)
		if err != nil {
			return nil, nil, err
		}
		if t == nil || !t.Terminal {
			continue
		}
		w.Seen = append(w.Seen, id)
		cause := &WakeCause{Kind: subjects.KindTaskResult, EnvelopeID: t.ResultEnvelopeID, Source: subjects.Source{Type: "task", ID: id}}
		switch {
		case !t.ResultConsumed && queued == nil:
			queued = cause
		case t.ResultConsumed:
			consumed = cause
		}
	}
	if !satisfied(w) {
		return nil, nil, nil
	}
	return queued, consumed, nil
}

// checkTask checks a task resource through Tasks, when wired, with
// Holon's rules and texts: it must exist and be the agent's.
func (s *Service) checkTask(ctx context.Context, agentID, taskID string) (*TaskState, error) {
	if s.cfg.Tasks == nil {
		return nil, nil
	}
	t, err := s.cfg.Tasks.LookupTask(ctx, agentID, taskID)
	if err != nil {
		return nil, fmt.Errorf("waitfor: task %s: %w", taskID, err)
	}
	switch {
	case t == nil:
		// Holon refuses a task it does not know, with this text. chime
		// could let the wait stand, as a task is also registered by its
		// first result, but does as Holon does: every task ID an agent
		// learns is registered before it is handed out (task.start, and
		// chime task run starts before it prints), so an unknown one is a
		// mistake that would wait for ever. To wait on a result to come
		// under an ID of its choosing, the agent starts that task first.
		return nil, &subjects.Error{Code: tasks.CodeTaskNotFound, Message: "wait_for task does not exist: " + taskID}
	case t.AgentID != agentID:
		return nil, &subjects.Error{Code: "task_agent_mismatch", Message: "wait_for task belongs to another agent: " + taskID}
	}
	return t, nil
}

// lastSeq is a stream's last sequence, or with subject the last of that
// subject (0: none).
func (s *Service) lastSeq(ctx context.Context, stream, subject string) (uint64, error) {
	st, err := s.cfg.JS.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("waitfor: stream %s: %w", stream, err)
	}
	if subject == "" {
		return st.CachedInfo().State.LastSeq, nil // the lookup's own STREAM.INFO, just answered
	}
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("waitfor: last of %s: %w", subject, err)
	}
	return m.Sequence, nil
}

// scan calls fn on subject's messages in stream from sequence from on,
// until fn says stop or catchUpLimit messages are read.
func (s *Service) scan(ctx context.Context, stream, subject string, from uint64, fn func(*jetstream.RawStreamMsg) bool) error {
	st, err := s.cfg.JS.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("waitfor: stream %s: %w", stream, err)
	}
	for range catchUpLimit {
		m, err := st.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("waitfor: read %s: %w", subject, err)
		}
		if fn(m) {
			return nil
		}
		from = m.Sequence + 1
	}
	return nil
}

// List returns a page of the agent's registrations (Store.List).
func (s *Service) List(ctx context.Context, agentID string, limit int, from subjects.CursorPos) ([]WaitFor, subjects.CursorPos, error) {
	return s.cfg.Store.List(ctx, agentID, limit, from)
}
