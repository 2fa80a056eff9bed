// Package quotas owns the per-agent admission limits: how many active
// timers, waiting waits, open questions, running tasks and live WaitFor
// registrations an agent may have, how many bytes of task output it may
// store, how fast it may ask for more timers and waits, start tasks and
// notify, and how many event streams (SSE) a principal may hold open. The
// API and the stores check them before they write, so a refused request
// stores nothing. Each refusal is quota_exceeded (a count: retrying helps
// once some end) or rate_limited (with how long until the next is taken),
// names its variable, and is counted in chime_quota_refusals_total.
package quotas

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/subjects"
)

// Counter tells how many active timers and waiting waits an agent has,
// cheaply: a create asks on every call and must not list the agent's
// records. In the unsharded layout the scheduler answers from what its KV
// watches saw of every shard (a few milliseconds behind the buckets); in
// the sharded layout scheduler.Counts sums the counts bucket in one read.
type Counter interface {
	ActiveTimers(ctx context.Context, agentID string) (int, error)
	ActiveWaits(ctx context.Context, agentID string) (int, error)
	// Admitted is told of each create let through, for a counter that
	// reuses a read and must not let a burst past it.
	Admitted(agentID string, wait bool)
}

// Refusal kinds, the quota label of chime_quota_refusals_total.
const (
	Timers       = "timers"
	Waits        = "waits"
	Interval     = "interval"
	Rate         = "rate"
	Questions    = "questions"
	RunningTasks = "running_tasks"
	TaskStarts   = "task_starts"
	TaskOutput   = "task_output"
	WaitFors     = "waitfors"
	Notifies     = "notifies"
	Streams      = "streams"
	MCPTasks     = "mcp_tasks"
	Monitors     = "monitors"
)

// kinds are every refusal kind, each a series from the start.
var kinds = []string{Timers, Waits, Interval, Rate, Questions, RunningTasks, TaskStarts, TaskOutput, WaitFors, Notifies, Streams, MCPTasks, Monitors}

// Config sets the limits; a zero limit is off.
type Config struct {
	// MaxTimers and MaxWaits bound an agent's active timers and waiting
	// waits (CHIME_MAX_TIMERS_PER_AGENT, CHIME_MAX_WAITS_PER_AGENT).
	MaxTimers, MaxWaits int
	// MaxQuestions bounds an agent's open questions
	// (CHIME_MAX_OPEN_QUESTIONS_PER_AGENT).
	MaxQuestions int
	// Counter answers the counts; needed when MaxTimers or MaxWaits is set.
	Counter Counter
	// MinInterval is the shortest repeat interval (CHIME_MIN_INTERVAL).
	MinInterval time.Duration
	// Rate is the creates per second an agent may make on this replica
	// (CHIME_CREATE_RATE), with Burst at once (CHIME_CREATE_BURST).
	Rate  float64
	Burst int
	// MaxAgents bounds the agents whose rate is remembered (default 65536).
	MaxAgents int

	// MaxRunningTasks bounds an agent's running tasks
	// (CHIME_MAX_RUNNING_TASKS_PER_AGENT); MaxTaskOutputBytes its stored
	// task output (CHIME_MAX_TASK_OUTPUT_BYTES_PER_AGENT). Tasks counts
	// both; needed when either is set.
	MaxRunningTasks    int
	MaxTaskOutputBytes int64
	Tasks              TaskCounter
	// TaskStartRate is the tasks per second an agent may start on this
	// replica (CHIME_TASK_START_RATE), in bursts of twice as many.
	TaskStartRate float64
	// MaxWaitFors bounds an agent's live WaitFor registrations
	// (CHIME_MAX_WAITFORS_PER_AGENT); WaitFors counts them.
	MaxWaitFors int
	WaitFors    WaitForCounter
	// NotifyRate is the notifies per second an agent may send on this
	// replica (CHIME_NOTIFY_RATE), in bursts of twice as many.
	NotifyRate float64
	// MaxStreams bounds the event streams (SSE) one principal holds open
	// on this replica (CHIME_MAX_STREAMS_PER_PRINCIPAL).
	MaxStreams int
	// MaxMCPTasks bounds the MCP tasks an agent holds
	// (CHIME_MAX_MCP_TASKS_PER_AGENT).
	MaxMCPTasks int
	// MaxMonitors bounds an agent's running monitors
	// (CHIME_MAX_MONITORS_PER_AGENT).
	MaxMonitors int

	Now        func() time.Time
	Registerer prometheus.Registerer
}

// Quotas checks creates against the limits. It is safe for concurrent use.
type Quotas struct {
	cfg      Config
	rate     *limiter // nil: no rate limit
	refusals *prometheus.CounterVec
	// taskStarts and notifies pace task starts and notifies (nil: no
	// limit); streams counts open event streams.
	taskStarts, notifies *limiter
	streams              streams
}

// New returns the checks of c.
func New(c Config) *Quotas {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxAgents <= 0 {
		c.MaxAgents = 1 << 16
	}
	q := &Quotas{
		cfg: c,
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_quota_refusals_total", Help: "Creates refused by a per-agent quota or limit, by quota.",
		}, []string{"quota"}),
	}
	for _, k := range kinds {
		q.refusals.WithLabelValues(k) // every series from the start, at 0
	}
	if c.Rate > 0 {
		q.rate = newLimiter(c.Rate, max(c.Burst, 1), c.MaxAgents)
	}
	q.taskStarts = pace(c.TaskStartRate, c.MaxAgents)
	q.notifies = pace(c.NotifyRate, c.MaxAgents)
	q.streams.open = map[string]int{}
	if c.Registerer != nil {
		c.Registerer.MustRegister(q.refusals)
	}
	return q
}

// MinInterval is the shortest repeat interval a timer may have
// (CHIME_MIN_INTERVAL); zero allows any positive one.
func (q *Quotas) MinInterval() time.Duration { return q.cfg.MinInterval }

// Timer admits one more timer for the agent, or says why not: the rate
// first (it is the cheaper check and paces an agent hammering at its
// quota), then the count.
func (q *Quotas) Timer(ctx context.Context, agentID string) error {
	return q.admit(ctx, agentID, Timers, q.cfg.MaxTimers, "active timers", "CHIME_MAX_TIMERS_PER_AGENT")
}

// Wait admits one more wait for the agent, as Timer does.
func (q *Quotas) Wait(ctx context.Context, agentID string) error {
	return q.admit(ctx, agentID, Waits, q.cfg.MaxWaits, "waiting waits", "CHIME_MAX_WAITS_PER_AGENT")
}

// Question admits one more open question for an agent that has open of
// them. An operator answers questions at human speed: the bound keeps an
// agent in a loop from burying them (and the bucket) in questions. Asks
// are not paced by CHIME_CREATE_RATE, which is for timers and waits.
func (q *Quotas) Question(agentID string, open int) error {
	return q.counted(Questions, open, q.cfg.MaxQuestions, "agent %s has %d open questions; at most %d are allowed (CHIME_MAX_OPEN_QUESTIONS_PER_AGENT)", agentID)
}

// MCPTask admits one more MCP task for an agent that holds held of them
// (going, or ended and not read yet): the handles share one bucket, and an
// agent in a loop must not fill it for the others.
func (q *Quotas) MCPTask(agentID string, held int) error {
	return q.counted(MCPTasks, held, q.cfg.MaxMCPTasks,
		"agent %s holds %d MCP tasks; at most %d are allowed (CHIME_MAX_MCP_TASKS_PER_AGENT): read the ended ones with tasks/get", agentID)
}

// Monitor admits one more running monitor for an agent that has running
// of them: each holds a record and a source, and a monitor that floods
// costs the inbox, so an agent in a loop must not start them unbounded.
func (q *Quotas) Monitor(agentID string, running int) error {
	return q.counted(Monitors, running, q.cfg.MaxMonitors,
		"agent %s has %d running monitors; at most %d are allowed (CHIME_MAX_MONITORS_PER_AGENT): stop one with monitor.stop", agentID)
}

// counted admits one more of kind for an agent that has n of them, under
// most (0: no bound); the refusal's message is format with the agent, n
// and most.
func (q *Quotas) counted(kind string, n, most int, format, agentID string) error {
	if most <= 0 || n < most {
		return nil
	}
	q.refusals.WithLabelValues(kind).Inc()
	return &subjects.Error{Code: subjects.CodeQuotaExceeded, Message: fmt.Sprintf(format, agentID, n, most)}
}

// RefusedInterval counts a create the decoder refused for its interval.
func (q *Quotas) RefusedInterval() { q.refusals.WithLabelValues(Interval).Inc() }

func (q *Quotas) admit(ctx context.Context, agentID, kind string, most int, what, variable string) error {
	if q.rate != nil {
		if wait, ok := q.rate.take(agentID, q.cfg.Now()); !ok {
			q.refusals.WithLabelValues(Rate).Inc()
			return &RateLimited{
				Wire: &subjects.Error{Code: subjects.CodeRateLimited, Message: fmt.Sprintf(
					"agent %s is creating timers and waits faster than %g a second (CHIME_CREATE_RATE); retry in %v",
					agentID, q.cfg.Rate, wait.Round(time.Millisecond))},
				After: wait,
			}
		}
	}
	if most <= 0 || q.cfg.Counter == nil {
		return nil
	}
	count := q.cfg.Counter.ActiveTimers
	if kind == Waits {
		count = q.cfg.Counter.ActiveWaits
	}
	n, err := count(ctx, agentID)
	if err != nil {
		return fmt.Errorf("quotas: count %s of agent %s: %w", kind, agentID, err)
	}
	// The count lags creates still on their way through the watch (on
	// this replica or another): concurrent creates may overshoot by
	// what is in flight.
	if n < most {
		q.cfg.Counter.Admitted(agentID, kind == Waits)
		return nil
	}
	q.refusals.WithLabelValues(kind).Inc()
	return &subjects.Error{Code: subjects.CodeQuotaExceeded, Message: fmt.Sprintf(
		"agent %s has %d %s; at most %d are allowed (%s)", agentID, n, what, most, variable)}
}

// RateLimited is the rate_limited refusal with how long until the agent's
// next create would be taken; the surfaces send it as Retry-After.
type RateLimited struct {
	Wire  *subjects.Error
	After time.Duration
}

func (e *RateLimited) Error() string { return e.Wire.Error() }
func (e *RateLimited) Unwrap() error { return e.Wire }

// RetryAfter is how long to wait before the next create.
func (e *RateLimited) RetryAfter() time.Duration { return e.After }
