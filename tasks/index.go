package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvwatch"
)

// Index counts, per agent, the running tasks and the stored output bytes,
// for the per-agent limits (quotas.TaskCounter). Every replica keeps one,
// from a KV watch of the task records (keys <agent>.<task>: neither owner
// keys nor output chunks), so a count costs no storage read. It lags the
// records by the watch's delay, a few milliseconds: concurrent starts or
// appends of one agent, on this replica or others, may pass a limit by
// what is in flight meanwhile.
//
// Stored output bytes are the appended bytes of a running task (its
// chunks) and the size of a finished task's output in the object store;
// an output kept in the record itself (at most subjects.MaxInlineOutput)
// is not counted. Only tasks that count are held, a few dozen bytes each.
type Index struct {
	watch *kvwatch.Watch

	mu     sync.Mutex
	tasks  map[string]usage // record key -> what it counts
	agents map[string]usage // agent -> its totals
}

// usage is what a task, or an agent's tasks together, count.
type usage struct {
	running int
	bytes   int64
}

// taskKeys matches the task records alone.
const taskKeys = "*.*"

// NewIndex returns the count of the tasks bucket; Start loads it.
func NewIndex(js jetstream.JetStream, bucket string, log *slog.Logger) *Index {
	ix := &Index{tasks: map[string]usage{}, agents: map[string]usage{}}
	ix.watch = kvwatch.New(kvwatch.Config{JS: js, Bucket: bucket, Keys: taskKeys, Apply: ix.apply, Reset: ix.reset, Log: log})
	return ix
}

// Start watches the tasks bucket and returns once its current records
// are counted; ctx bounds only that. The watch runs until Stop.
func (ix *Index) Start(ctx context.Context) error {
	if err := ix.watch.StartLoaded(ctx); err != nil {
		return fmt.Errorf("tasks: index: %w", err)
	}
	return nil
}

// Stop ends the watch. Idempotent and safe without Start.
func (ix *Index) Stop(ctx context.Context) error { return ix.watch.Stop(ctx) }

// RunningTasks is how many of the agent's tasks run.
func (ix *Index) RunningTasks(agentID string) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.agents[agentID].running
}

// TaskOutputBytes is how many bytes of task output the agent has stored.
func (ix *Index) TaskOutputBytes(agentID string) int64 {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.agents[agentID].bytes
}

func (ix *Index) reset() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.tasks, ix.agents = map[string]usage{}, map[string]usage{}
}

// counted is the part of a task record the index reads.
type counted struct {
	Status        TaskStatus `json:"status"`
	OutputSize    int64      `json:"output_size"`
	OutputRef     string     `json:"output_ref"`
	AppendedBytes int64      `json:"appended_bytes"`
}

// apply folds one record change in: the record's old usage goes, its new
// one comes.
func (ix *Index) apply(e kvwatch.Entry) {
	agentID, _, ok := strings.Cut(e.Key, ".")
	if !ok {
		return
	}
	var now usage
	var t counted
	if !e.Deleted && json.Unmarshal(e.Value, &t) == nil {
		switch {
		case t.Status == TaskRunning:
			now = usage{running: 1, bytes: t.AppendedBytes}
		case t.OutputRef != "":
			now.bytes = t.OutputSize
		}
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	was := ix.tasks[e.Key]
	if was == now {
		return
	}
	if now == (usage{}) {
		delete(ix.tasks, e.Key)
	} else {
		ix.tasks[e.Key] = now
	}
	total := ix.agents[agentID]
	total.running += now.running - was.running
	total.bytes += now.bytes - was.bytes
	if total == (usage{}) {
		delete(ix.agents, agentID)
	} else {
		ix.agents[agentID] = total
	}
}
