package quotas

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/chime-nats/chime/subjects"
)

// TaskCounter tells an agent's running tasks and stored task output bytes
// cheaply, as Counter does timers: tasks.Index answers from a KV watch of
// the task records that every replica keeps.
type TaskCounter interface {
	RunningTasks(agentID string) int
	TaskOutputBytes(agentID string) int64
}

// WaitForCounter tells an agent's live WaitFor registrations, one a scope
// at most: waitfor.Index answers from the view every replica keeps.
type WaitForCounter interface {
	ActiveWaitFors(agentID string) int
	// HasWaitFor reports a live registration in the scope of workItemID
	// ("": the agent scope), which a new one there replaces.
	HasWaitFor(agentID, workItemID string) bool
}

// pace is the token buckets of a rate, bursts of twice the rate (at least
// one); nil for no limit.
func pace(perSecond float64, maxAgents int) *limiter {
	if perSecond <= 0 {
		return nil
	}
	return newLimiter(perSecond, max(1, int(math.Ceil(2*perSecond))), maxAgents)
}

// paced takes a token of l for the agent, or answers rate_limited.
func (q *Quotas) paced(l *limiter, agentID, kind string, rate float64, what, variable string) error {
	if l == nil {
		return nil
	}
	wait, ok := l.take(agentID, q.cfg.Now())
	if ok {
		return nil
	}
	q.refusals.WithLabelValues(kind).Inc()
	return &RateLimited{
		Wire: &subjects.Error{Code: subjects.CodeRateLimited, Message: fmt.Sprintf(
			"agent %s is %s faster than %g a second (%s); retry in %v", agentID, what, rate, variable, wait.Round(time.Millisecond))},
		After: wait,
	}
}

// StartTask admits a new task of the agent's: its start rate first, then,
// for one that will run, its running tasks. A task registered finished by
// its first result is paced alike but runs for no time. The count lags
// starts still on their way through the watch (on any replica): starts
// at once may pass the limit by those in flight, at most a burst of the
// start rate on each replica.
func (q *Quotas) StartTask(agentID string, running bool) error {
	if err := q.paced(q.taskStarts, agentID, TaskStarts, q.cfg.TaskStartRate, "starting tasks", "CHIME_TASK_START_RATE"); err != nil {
		return err
	}
	most := q.cfg.MaxRunningTasks
	if !running || most <= 0 || q.cfg.Tasks == nil {
		return nil
	}
	if n := q.cfg.Tasks.RunningTasks(agentID); n >= most {
		q.refusals.WithLabelValues(RunningTasks).Inc()
		return &subjects.Error{Code: subjects.CodeQuotaExceeded, Message: fmt.Sprintf(
			"agent %s has %d running tasks; at most %d are allowed (CHIME_MAX_RUNNING_TASKS_PER_AGENT): report or cancel some first", agentID, n, most)}
	}
	return nil
}

// AddOutput admits n more bytes of the agent's stored task output (an
// appended part, or a whole output sent with the result). Stored bytes
// go when their tasks expire (CHIME_RECORD_RETENTION). Appends at once
// may pass the limit by the parts in flight.
func (q *Quotas) AddOutput(agentID string, n int64) error {
	most := q.cfg.MaxTaskOutputBytes
	if most <= 0 || q.cfg.Tasks == nil {
		return nil
	}
	if have := q.cfg.Tasks.TaskOutputBytes(agentID); have+n > most {
		q.refusals.WithLabelValues(TaskOutput).Inc()
		return &subjects.Error{Code: subjects.CodeQuotaExceeded, Message: fmt.Sprintf(
			"agent %s stores %d bytes of task output; %d more would pass the %d allowed (CHIME_MAX_TASK_OUTPUT_BYTES_PER_AGENT); "+
				"stored outputs go when their tasks expire", agentID, have, n, most)}
	}
	return nil
}

// WaitFor admits a WaitFor registration in the agent's scope of
// workItemID: one that replaces the scope's live registration always,
// one in a new scope while the agent has fewer than the limit.
func (q *Quotas) WaitFor(agentID, workItemID string) error {
	most := q.cfg.MaxWaitFors
	if most <= 0 || q.cfg.WaitFors == nil || q.cfg.WaitFors.HasWaitFor(agentID, workItemID) {
		return nil
	}
	if n := q.cfg.WaitFors.ActiveWaitFors(agentID); n >= most {
		q.refusals.WithLabelValues(WaitFors).Inc()
		return &subjects.Error{Code: subjects.CodeQuotaExceeded, Message: fmt.Sprintf(
			"agent %s has %d live WaitFor registrations; at most %d are allowed (CHIME_MAX_WAITFORS_PER_AGENT)", agentID, n, most)}
	}
	return nil
}

// Notify admits one notify of the agent's.
func (q *Quotas) Notify(agentID string) error {
	return q.paced(q.notifies, agentID, Notifies, q.cfg.NotifyRate, "notifying", "CHIME_NOTIFY_RATE")
}

// streams counts the event streams open on this replica, by principal.
type streams struct {
	mu   sync.Mutex
	open map[string]int
}

// OpenStream admits one more event stream of principal (a name that
// holds no secret: see api) on this replica; release, called once when
// it ends, gives its place back.
func (q *Quotas) OpenStream(principal string) (release func(), err error) {
	most := q.cfg.MaxStreams
	s := &q.streams
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.open[principal]; most > 0 && n >= most {
		q.refusals.WithLabelValues(Streams).Inc()
		return nil, &subjects.Error{Code: subjects.CodeQuotaExceeded, Message: fmt.Sprintf(
			"%s has %d event streams open on this replica; at most %d are allowed (CHIME_MAX_STREAMS_PER_PRINCIPAL): close one first", principal, n, most)}
	}
	s.open[principal]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.open[principal]--; s.open[principal] <= 0 {
				delete(s.open, principal)
			}
		})
	}, nil
}
