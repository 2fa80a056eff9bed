package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// ChaosResult is what a chaos run found, counted from the inbox stream (what
// agents were given) against the timer and wait records.
type ChaosResult struct {
	Config   ChaosConfig   `json:"config"`
	Timers   ChaosTimers   `json:"timers"`
	Waits    ChaosWaits    `json:"waits"`
	Requests ChaosRequests `json:"requests"`
	// Lost and Duplicated are the timers' and the waits' together.
	Lost       int `json:"lost"`
	Duplicated int `json:"duplicated"`
	// OtherDeliveries are inbox messages of other kinds (none expected).
	OtherDeliveries int `json:"other_deliveries"`
	// Kills are the kills, or the partitions, in order.
	Kills       []ChaosKill    `json:"kills"`
	KillsByKind map[string]int `json:"kills_by_kind"`
	// PartitionsByKind counts the partitions done, by kind.
	PartitionsByKind map[string]int `json:"partitions_by_kind,omitempty"`
	// BeforeKills counts what was due before the first kill.
	BeforeKills ChaosTally `json:"before_kills"`
	// WorstTakeover is the kill with the largest TakeoverMs.
	WorstTakeover *ChaosWorst          `json:"worst_takeover,omitempty"`
	ReplicaLogs   map[string]LogCounts `json:"replica_logs"`
	// DuplicateAcks are, with partitions (replicas never restart), each
	// replica's chime_fire_duplicates_total at the end: fire publishes the
	// inbox stream acknowledged as duplicates. Absent when not exposed.
	DuplicateAcks map[string]int `json:"duplicate_acks,omitempty"`
	// NotCurrentAtRead are the streams with a replica still behind when
	// the records and the inbox were read (after 60 s of waiting each):
	// a lagging replica answering a direct get makes lost or unapplied
	// figures possibly the reader's, not chime's.
	NotCurrentAtRead []string `json:"not_current_at_read,omitempty"`
	// LostShards are the shards of the lost deliveries, and who held
	// each shard's lease when the records were read: a loss confined to
	// one replica's shards points at that replica.
	LostShards []ChaosShardLoss `json:"lost_shards,omitempty"`
	// Examples name the first lost, duplicated and latest deliveries.
	Examples []string `json:"examples,omitempty"`
	OK       bool     `json:"ok"` // nothing lost or duplicated
	WorkDir  string   `json:"work_dir,omitempty"`
}

// ChaosShardLoss is how many deliveries of one shard were lost.
type ChaosShardLoss struct {
	Shard int `json:"shard"`
	Lost  int `json:"lost"`
	// Holder is the replica holding the shard's lease at the read; empty
	// when none did, or the leases could not be read.
	Holder string `json:"holder,omitempty"`
}

// ChaosConfig echoes the run's settings.
type ChaosConfig struct {
	// LoadStart is when load began (wall clock, for the logs): every "at"
	// of the result is seconds after it.
	LoadStart   time.Time `json:"load_start"`
	Servers     int       `json:"servers"`
	JSReplicas  int       `json:"js_replicas"`
	Replicas    int       `json:"replicas"`
	DurationS   float64   `json:"duration_s"`
	Rate        float64   `json:"rate"`
	Agents      int       `json:"agents"`
	Repeating   int       `json:"repeating"`
	IntervalMs  int64     `json:"interval_ms"`
	Calendar    int       `json:"calendar"`
	WaitRate    float64   `json:"wait_rate"`
	CancelEvery int       `json:"cancel_every"`
	EveryS      float64   `json:"every_s"`
	DownS       float64   `json:"down_s"`
	Kill        []string  `json:"kill"`
	Partition   []string  `json:"partition,omitempty"`
	GraceS      float64   `json:"grace_s"`
}

// ChaosTimers counts timers and their deliveries.
type ChaosTimers struct {
	Created   int `json:"created"` // timer records found
	OneShot   int `json:"one_shot"`
	Repeating int `json:"repeating"` // interval and calendar timers
	Calendar  int `json:"calendar"`
	// Unacknowledged records were created by a request whose reply never
	// came (the bench retried it); they are expected to fire like any.
	Unacknowledged int `json:"unacknowledged"`
	CreateFailed   int `json:"create_failed"` // creates that never succeeded
	Cancelled      int `json:"cancelled"`     // one-shots cancelled before they were due
	// Expected deliveries: one per one-shot not cancelled, and each
	// repeating timer's occurrences 1..fire_count of its final record.
	Expected          int `json:"expected"`
	ExpectedOneShot   int `json:"expected_one_shot"`
	ExpectedRepeating int `json:"expected_repeating"`
	Delivered         int `json:"delivered"` // distinct timer_fired envelopes
	Lost              int `json:"lost"`      // expected and never delivered, or acknowledged and without a record
	// Duplicated: deliveries beyond the first of an occurrence (same
	// envelope ID), or of a one-shot.
	Duplicated int `json:"duplicated"`
	// Deliveries of cancelled timers, not expected: RacedCancel were due
	// before the cancel was acknowledged (the fire was under way);
	// FiredAfterCancel were due after it, so the replica that fired had
	// not learnt of the cancel yet, FiredAfterCancelMaxMs after it was
	// acknowledged at most; CancelBoundBroken of them were stored more
	// than 2 s after it, the bound e2e's fault tests hold chime to.
	RacedCancel           int     `json:"raced_cancel"`
	FiredAfterCancel      int     `json:"fired_after_cancel"`
	FiredAfterCancelMaxMs float64 `json:"fired_after_cancel_max_ms"`
	CancelBoundBroken     int     `json:"cancel_bound_broken"`
	// Unapplied: delivered, but the record never counted the occurrence
	// (fire_count below it, or a one-shot still active).
	Unapplied      int `json:"unapplied"`
	MissingRecords int `json:"missing_records"` // acknowledged creates with no record
	Unknown        int `json:"unknown"`         // deliveries of timers with no record
	// Late: delivered (stored in the inbox stream) more than 2 s after due.
	Late       int     `json:"late"`
	LatenessMs Latency `json:"lateness_ms"`
	// CadenceTicks: the repeating timers' cadence points from each one's
	// first stored occurrence to its last; TicksNotCovered of them fell
	// between two consecutive stored occurrences and were not covered by
	// a catch-up fire (timers.CadenceCoverage): skipped silently. 0 is
	// the contract.
	CadenceTicks    int `json:"cadence_ticks"`
	TicksNotCovered int `json:"cadence_ticks_not_covered"`
	// CalendarTicks and CalendarTicksNotCovered are the same for the
	// calendar timers, against their schedule (timers.ScheduleCoverage);
	// CalendarTimesTwice counts scheduled times stored under more than
	// one occurrence (a calendar fire is one per scheduled time).
	CalendarTicks           int `json:"calendar_ticks"`
	CalendarTicksNotCovered int `json:"calendar_ticks_not_covered"`
	CalendarTimesTwice      int `json:"calendar_times_twice"`
}

// ChaosWaits counts managed waits and their terminal deliveries.
type ChaosWaits struct {
	Created       int     `json:"created"` // wait records found
	RequestFailed int     `json:"request_failed"`
	Completed     int     `json:"completed"` // waits with a wait_complete delivery
	Cancelled     int     `json:"cancelled"` // waits ended wait_cancelled (none expected)
	Lost          int     `json:"lost"`
	Duplicated    int     `json:"duplicated"`
	Late          int     `json:"late"`
	LatenessMs    Latency `json:"lateness_ms"`
}

// ChaosRequests counts the bench's requests and why they were retried.
type ChaosRequests struct {
	Requests     int64 `json:"requests"`
	Retries      int64 `json:"retries"`
	Unavailable  int64 `json:"unavailable"`
	Internal     int64 `json:"internal"`
	Timeouts     int64 `json:"timeouts"`
	NoResponders int64 `json:"no_responders"`
	OtherErrors  int64 `json:"other_errors"`
	CancelFailed int   `json:"cancel_failed"`
}

// ChaosTally counts what went wrong among deliveries due in a period.
type ChaosTally struct {
	Late       int `json:"late"`
	Lost       int `json:"lost"`
	Duplicated int `json:"duplicated"`
	// CreatedWithoutReply: timers created in the period by a request whose
	// reply never came (by the record's created_at): the retry created
	// another.
	CreatedWithoutReply int `json:"created_without_reply"`
}

// ChaosKill is one kill and what it cost.
type ChaosKill struct {
	N         int     `json:"n"`
	Kind      string  `json:"kind"`
	Target    string  `json:"target"`
	Stream    string  `json:"stream,omitempty"`
	NewLeader string  `json:"new_leader,omitempty"`
	AtS       float64 `json:"at_s"` // seconds into the load
	// Milliseconds from the SIGKILL to: another leader (leader kills on a
	// cluster), the target answering again (/readyz 200 or a NATS ping),
	// every chime stream current again (cluster).
	ElectedMs  int64    `json:"elected_ms,omitempty"`
	BackMs     int64    `json:"back_ms"`
	CaughtUpMs int64    `json:"caught_up_ms,omitempty"`
	Errors     []string `json:"errors,omitempty"`
	Skipped    bool     `json:"skipped,omitempty"`
	// DueInOutage: timer occurrences and waits due between the SIGKILL and
	// the target answering again (or, if later, another leader elected);
	// TakeoverMs: the longest any of them was delivered after its due
	// time, the worst an agent saw from this kill.
	DueInOutage int     `json:"due_in_outage"`
	TakeoverMs  float64 `json:"takeover_ms"`
	// Of everything due from this kill until the next one.
	ChaosTally
	// Partition is set on partitions only: AtS is then the cut, BackMs
	// the heal.
	Partition *ChaosCut `json:"partition,omitempty"`
}

// ChaosCut is what a partition cost, beside its kill-like figures.
type ChaosCut struct {
	Addr string `json:"addr"` // the target's address in its namespace
	// Due: timer occurrences and wait ends due between the cut and the
	// heal; Stored of them were stored in the inbox before the heal
	// (StoredPct percent); MaxLateMs is the latest any of them was stored
	// after its due time (lost ones aside: they count in Lost).
	Due       int     `json:"due"`
	Stored    int     `json:"stored"`
	StoredPct float64 `json:"stored_pct"`
	MaxLateMs float64 `json:"max_late_ms"`
	// DuplicateAcks: fire publishes the inbox stream acknowledged as
	// duplicates (chime_fire_duplicates_total, all replicas) from the cut
	// until every chime stream was current after the heal; absent when
	// the replicas do not expose the counter.
	DuplicateAcks *int `json:"duplicate_acks,omitempty"`
	// FailedUntilMs: the latest request attempt begun during the cut that
	// failed for want of chime (timed out, no responder, unavailable),
	// counted from the cut; 0 when none failed. Past it, every request
	// was answered.
	FailedUntilMs int64 `json:"failed_until_ms"`
}

// ChaosWorst names the kill with the worst takeover.
type ChaosWorst struct {
	Kill       int     `json:"kill"`
	Kind       string  `json:"kind"`
	Target     string  `json:"target"`
	TakeoverMs float64 `json:"takeover_ms"`
}

// LogCounts counts a replica's starts and its WARN and ERROR log lines.
type LogCounts struct {
	Starts int `json:"starts"`
	Warn   int `json:"warn"`
	Error  int `json:"error"`
	// Stalls are the WARN lines reporting shards held but not firing
	// (one every 10 s while it lasts).
	Stalls int `json:"stalls"`
}

// Err is non-nil when anything was lost or duplicated.
func (r *ChaosResult) Err() error {
	if r.OK {
		return nil
	}
	return fmt.Errorf("bench chaos: %d deliveries lost, %d duplicated, %d cadence ticks and %d calendar times skipped",
		r.Lost, r.Duplicated, r.Timers.TicksNotCovered, r.Timers.CalendarTicksNotCovered)
}

func (r *chaosRun) config() ChaosConfig {
	return ChaosConfig{
		LoadStart: r.start, Servers: r.o.Servers, JSReplicas: r.jsReplicas(), Replicas: r.o.Replicas, DurationS: r.o.Duration.Seconds(),
		Rate: r.o.Rate, Agents: r.o.Agents, Repeating: r.o.Repeating, IntervalMs: r.o.Interval.Milliseconds(), Calendar: r.o.Calendar,
		WaitRate: r.o.WaitRate, CancelEvery: r.o.CancelEvery, EveryS: r.o.Every.Seconds(), DownS: r.o.Down.Seconds(),
		Kill: r.o.Kill, Partition: r.o.Partition, GraceS: r.o.Grace.Seconds(),
	}
}

// item is one expected delivery: due then, late by this much, or lost.
type item struct {
	due  time.Time // zero when unknown (a lost occurrence of a repeating timer)
	late time.Duration
	lost bool
	dup  int
}

// finding is a line for the examples.
type finding struct {
	order int // lost, duplicated, late
	due   time.Time
	late  time.Duration
	text  string
}

type fire struct {
	stored, due time.Time
	nextDue     *time.Time // next_due_at, a repeating timer's
}

type waitEnd struct {
	kind   string
	stored time.Time
	target time.Time
}

// timesTwice counts the scheduled times of a calendar timer's fires that
// were stored under more than one occurrence number.
func timesTwice(occ map[int64][]fire) int {
	seen := map[time.Time]int64{}
	n := 0
	for o, fs := range occ {
		for _, f := range fs {
			k := f.due.UTC()
			if prev, ok := seen[k]; ok && prev != o {
				n++
				continue
			}
			seen[k] = o
		}
	}
	return n
}

// analyze counts the inbox against the records.
func (r *chaosRun) analyze(obs *observed) *ChaosResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := &ChaosResult{Config: r.config(), KillsByKind: map[string]int{}, ReplicaLogs: r.replicaLogCounts()}
	res.Requests = ChaosRequests{
		Requests: r.stats.requests.Load(), Retries: r.stats.retries.Load(), Unavailable: r.stats.unavailable.Load(),
		Internal: r.stats.internal.Load(), Timeouts: r.stats.timeouts.Load(), NoResponders: r.stats.noResponders.Load(),
		OtherErrors:  r.stats.otherErrors.Load(),
		CancelFailed: r.cancelFail,
	}

	fires := map[string]map[int64][]fire{}
	ends := map[string][]waitEnd{}
	for _, m := range obs.inbox {
		switch m.env.Kind {
		case subjects.KindTimerFired:
			var d timers.TimerFiredData
			if json.Unmarshal(m.env.Data, &d) != nil {
				res.OtherDeliveries++
				continue
			}
			if fires[d.TimerID] == nil {
				fires[d.TimerID] = map[int64][]fire{}
			}
			fires[d.TimerID][d.Occurrence] = append(fires[d.TimerID][d.Occurrence], fire{stored: m.stored, due: d.DueAt, nextDue: d.NextDueAt})
		case subjects.KindWaitComplete, subjects.KindWaitCancelled:
			var d waits.WaitEndData
			if json.Unmarshal(m.env.Data, &d) != nil {
				res.OtherDeliveries++
				continue
			}
			target, _ := waits.ParseUntil(d.TargetTime, time.UTC)
			ends[d.WaitID] = append(ends[d.WaitID], waitEnd{kind: m.env.Kind, stored: m.stored, target: target})
		default:
			res.OtherDeliveries++
		}
	}

	var items []item
	var findings []finding
	var timerLateness, waitLateness []time.Duration
	var unacked []time.Time
	t := &res.Timers
	t.CreateFailed = r.createFail

	// delivered records the first delivery of an occurrence and returns
	// its item; dup deliveries count on it.
	delivered := func(what string, fs []fire, dup int) item {
		it := item{due: fs[0].due, late: fs[0].stored.Sub(fs[0].due), dup: dup}
		timerLateness = append(timerLateness, it.late)
		t.Delivered++
		if it.late > LateAfter {
			t.Late++
		}
		if dup > 0 {
			findings = append(findings, finding{order: findBad, due: it.due, text: fmt.Sprintf("duplicated: %s delivered %d times, due %s, stored %s", what, dup+1, r.at(it.due), r.storedAt(fs))})
		}
		if it.late > LateAfter {
			findings = append(findings, finding{order: findLate, due: it.due, late: it.late, text: fmt.Sprintf("late: %s due %s, delivered %s (%v late)", what, r.at(it.due), r.at(fs[0].stored), ms3(it.late))})
		}
		return it
	}
	// afterCancel classes the delivery f of a cancelled timer.
	afterCancel := func(what string, req *timerReq, f fire) {
		if req == nil || req.cancelled.IsZero() || !f.due.After(req.cancelled) {
			t.RacedCancel++
			return
		}
		t.FiredAfterCancel++
		after := f.stored.Sub(req.cancelled)
		t.FiredAfterCancelMaxMs = max(t.FiredAfterCancelMaxMs, ms(after))
		order := findAfterCncl
		if after > LateAfter {
			t.CancelBoundBroken++
			order = findBad
		}
		findings = append(findings, finding{order: order, due: f.due, late: after,
			text: fmt.Sprintf("fired after cancel: %s cancel acknowledged %s, due %s, delivered %s (%v after the cancel)", what, r.at(req.cancelled), r.at(f.due), r.at(f.stored), ms3(after))})
	}
	lostIn := map[int]int{} // lost deliveries by shard
	lost := func(what, agent, id string, due time.Time, why string) item {
		lostIn[partitions.ShardOf(subjects.TimerKey(agent, id), chaosShards)]++
		findings = append(findings, finding{order: findLost, due: due, text: fmt.Sprintf("lost: %s due %s: %s", what, r.at(due), why)})
		return item{due: due, lost: true}
	}

	for _, id := range slices.Sorted(maps.Keys(obs.timers)) {
		rec := obs.timers[id]
		req := r.timers[id]
		t.Created++
		if req == nil {
			t.Unacknowledged++
			unacked = append(unacked, rec.CreatedAt)
		}
		occ := fires[id]
		delete(fires, id)
		what := fmt.Sprintf("timer %s of %s", id, rec.AgentID)
		if !rec.Repeat {
			t.OneShot++
			var all []fire
			for _, n := range slices.Sorted(maps.Keys(occ)) {
				all = append(all, occ[n]...)
			}
			cancelled := rec.Status == timers.TimerCancelled
			if cancelled {
				t.Cancelled++
				if len(all) > 0 {
					afterCancel(what, req, all[0])
				}
			} else {
				t.ExpectedOneShot++
			}
			switch {
			case len(all) > 0:
				items = append(items, delivered(what, all, len(all)-1))
				t.Duplicated += len(all) - 1
				if rec.Status == timers.TimerActive {
					t.Unapplied++
				}
			case !cancelled:
				t.Lost++
				items = append(items, lost(what, rec.AgentID, id, rec.CreatedAt.Add(time.Duration(rec.DurationMs)*time.Millisecond),
					fmt.Sprintf("record %s, fire_count %d", rec.Status, rec.FireCount)))
			}
			continue
		}
		t.Repeating++
		t.ExpectedRepeating += int(rec.FireCount)
		var stored []timers.StoredFire
		for n, fs := range occ {
			for _, f := range fs {
				stored = append(stored, timers.StoredFire{Occurrence: n, DueAt: f.due, NextDueAt: f.nextDue, StoredAt: f.stored})
			}
		}
		var cov timers.Coverage
		if cal := timers.CalendarFor(rec, nil); cal != nil {
			t.Calendar++
			cov = timers.ScheduleCoverage(stored, cal.Next)
			t.CalendarTicks += cov.Ticks
			t.CalendarTicksNotCovered += cov.Uncovered
			t.CalendarTimesTwice += timesTwice(occ)
		} else {
			cov = timers.CadenceCoverage(stored, rec.Interval())
			t.CadenceTicks += cov.Ticks
			t.TicksNotCovered += cov.Uncovered
		}
		if cov.Uncovered > 0 {
			findings = append(findings, finding{order: findBad, due: cov.FirstUncovered,
				text: fmt.Sprintf("skipped: %s: %d cadence ticks not covered by a catch-up fire, the first due %s", what, cov.Uncovered, r.at(cov.FirstUncovered))})
		}
		var prevDue time.Time
		for n := int64(1); n <= rec.FireCount; n++ {
			w := fmt.Sprintf("%s occurrence %d", what, n)
			fs := occ[n]
			delete(occ, n)
			if len(fs) == 0 {
				var due time.Time
				if !prevDue.IsZero() {
					due = prevDue.Add(rec.Interval()) // about: after downtime a cadence skips
				}
				t.Lost++
				items = append(items, lost(w, rec.AgentID, id, due, fmt.Sprintf("record %s, fire_count %d", rec.Status, rec.FireCount)))
				prevDue = time.Time{}
				continue
			}
			items = append(items, delivered(w, fs, len(fs)-1))
			t.Duplicated += len(fs) - 1
			prevDue = fs[0].due
		}
		// Occurrences beyond fire_count: fired as the cancel was applied
		// (fine within 2 s of it), or fires the record never counted.
		for _, n := range slices.Sorted(maps.Keys(occ)) {
			fs := occ[n]
			w := fmt.Sprintf("%s occurrence %d", what, n)
			items = append(items, delivered(w, fs, len(fs)-1))
			t.Duplicated += len(fs) - 1
			if rec.Status == timers.TimerCancelled {
				afterCancel(w, req, fs[0])
			} else {
				t.Unapplied++
			}
		}
	}
	for id, req := range r.timers {
		if obs.timers[id] == nil {
			t.MissingRecords++
			t.Lost++
			items = append(items, lost("timer "+id+" of "+req.agent, req.agent, id, req.due, "acknowledged, but no record"))
		}
	}
	for _, occ := range fires {
		for _, fs := range occ {
			t.Unknown += len(fs)
		}
	}
	t.Expected = t.ExpectedOneShot + t.ExpectedRepeating
	t.LatenessMs = summarize(timerLateness)

	w := &res.Waits
	w.RequestFailed = r.waitFail
	for _, id := range slices.Sorted(maps.Keys(obs.waits)) {
		rec := obs.waits[id]
		w.Created++
		what := fmt.Sprintf("wait %s of %s", id, rec.AgentID)
		es := ends[id]
		delete(ends, id)
		if len(es) == 0 {
			w.Lost++
			items = append(items, lost(what, rec.AgentID, id, rec.TargetTime, fmt.Sprintf("record %s", rec.Status)))
			continue
		}
		if len(es) > 1 {
			w.Duplicated += len(es) - 1
			findings = append(findings, finding{order: findBad, due: rec.TargetTime, text: fmt.Sprintf("duplicated: %s ended %d times", what, len(es))})
		}
		e := es[0]
		if e.kind == subjects.KindWaitCancelled {
			w.Cancelled++
			continue
		}
		w.Completed++
		due := e.target
		if due.IsZero() {
			due = rec.TargetTime
		}
		it := item{due: due, late: e.stored.Sub(due), dup: len(es) - 1}
		waitLateness = append(waitLateness, it.late)
		if it.late > LateAfter {
			w.Late++
			findings = append(findings, finding{order: findLate, due: due, late: it.late, text: fmt.Sprintf("late: %s due %s, completed %s (%v late)", what, r.at(due), r.at(e.stored), ms3(it.late))})
		}
		items = append(items, it)
	}
	for id, req := range r.waits {
		if obs.waits[id] == nil {
			w.Lost++
			items = append(items, lost("wait "+id+" of "+req.agent, req.agent, id, req.target, "acknowledged, but no record"))
		}
	}
	for _, es := range ends {
		res.OtherDeliveries += len(es) // ends of waits with no record
	}
	w.LatenessMs = summarize(waitLateness)

	res.Lost = t.Lost + w.Lost
	for _, sh := range slices.Sorted(maps.Keys(lostIn)) {
		res.LostShards = append(res.LostShards, ChaosShardLoss{Shard: sh, Lost: lostIn[sh]})
	}
	res.Duplicated = t.Duplicated + w.Duplicated
	// A tick skipped silently is as much a broken promise as a lost fire.
	res.OK = res.Lost == 0 && res.Duplicated == 0 && t.TicksNotCovered == 0 && t.CalendarTicksNotCovered == 0
	r.killFigures(res, items, unacked)
	res.Examples = examples(findings)
	return res
}

// killFigures fills in each kill's takeover and the tallies of what was
// due from it until the next kill.
func (r *chaosRun) killFigures(res *ChaosResult, items []item, unacked []time.Time) {
	for _, k := range r.kills {
		ck := ChaosKill{
			N: k.n, Kind: k.kind, Target: k.target, Stream: k.stream, NewLeader: k.newLeader, AtS: r.since(k.at),
			BackMs: k.back.Sub(k.at).Milliseconds(), Errors: k.errs, Skipped: k.skipped,
		}
		if k.cut {
			ck.Partition = &ChaosCut{Addr: k.addr, DuplicateAcks: k.dupAcks}
		}
		if !k.elected.IsZero() {
			ck.ElectedMs = k.elected.Sub(k.at).Milliseconds()
		}
		if !k.caughtUp.IsZero() {
			ck.CaughtUpMs = k.caughtUp.Sub(k.at).Milliseconds()
		}
		res.Kills = append(res.Kills, ck)
		switch {
		case k.skipped:
		case k.cut:
			if res.PartitionsByKind == nil {
				res.PartitionsByKind = map[string]int{}
			}
			res.PartitionsByKind[k.kind]++
		default:
			res.KillsByKind[k.kind]++
		}
	}
	for _, it := range items {
		if it.due.IsZero() {
			continue
		}
		tally := &res.BeforeKills
		for i, k := range r.kills {
			if it.due.Before(k.at) {
				break
			}
			tally = &res.Kills[i].ChaosTally
			if c := res.Kills[i].Partition; c != nil && !k.skipped && !it.due.After(k.back) {
				c.Due++
				if !it.lost {
					c.MaxLateMs = max(c.MaxLateMs, ms(it.late))
					if !it.due.Add(it.late).After(k.back) {
						c.Stored++
					}
				}
			}
			if !k.skipped && !it.due.After(k.outageEnd()) {
				res.Kills[i].DueInOutage++
				if !it.lost {
					res.Kills[i].TakeoverMs = max(res.Kills[i].TakeoverMs, ms(it.late))
				}
			}
		}
		switch {
		case it.lost:
			tally.Lost++
		case it.late > LateAfter:
			tally.Late++
		}
		tally.Duplicated += it.dup
	}
	for _, at := range r.failedAt {
		for i, k := range r.kills {
			c := res.Kills[i].Partition
			if c != nil && !k.skipped && !at.Before(k.at) && !at.After(k.back) {
				c.FailedUntilMs = max(c.FailedUntilMs, at.Sub(k.at).Milliseconds())
			}
		}
	}
	for _, at := range unacked {
		tally := &res.BeforeKills
		for i, k := range r.kills {
			if at.Before(k.at) {
				break
			}
			tally = &res.Kills[i].ChaosTally
		}
		tally.CreatedWithoutReply++
	}
	for i := range res.Kills {
		if c := res.Kills[i].Partition; c != nil && c.Due > 0 {
			c.StoredPct = 100 * float64(c.Stored) / float64(c.Due)
		}
	}
	for _, k := range res.Kills {
		if k.DueInOutage > 0 && (res.WorstTakeover == nil || k.TakeoverMs > res.WorstTakeover.TakeoverMs) {
			res.WorstTakeover = &ChaosWorst{Kill: k.N, Kind: k.Kind, Target: k.Target, TakeoverMs: k.TakeoverMs}
		}
	}
}

// Orders of findings.
const (
	findLost      = 0
	findBad       = 1 // duplicated, or fired more than 2 s after a cancel
	findLate      = 2
	findAfterCncl = 3 // fired after a cancel, within 2 s
)

// examples keeps the first lost and duplicated findings by due time, then
// the latest deliveries and fires after a cancel.
func examples(fs []finding) []string {
	var out []string
	bad := slices.DeleteFunc(slices.Clone(fs), func(f finding) bool { return f.order > findBad })
	slices.SortStableFunc(bad, func(a, b finding) int { return cmp.Or(cmp.Compare(a.order, b.order), a.due.Compare(b.due)) })
	for _, f := range bad[:min(len(bad), 20)] {
		out = append(out, f.text)
	}
	for _, order := range []int{findLate, findAfterCncl} {
		worst := slices.DeleteFunc(slices.Clone(fs), func(f finding) bool { return f.order != order })
		slices.SortFunc(worst, func(a, b finding) int { return cmp.Compare(b.late, a.late) })
		for _, f := range worst[:min(len(worst), 5)] {
			out = append(out, f.text)
		}
	}
	return out
}

// at is t as seconds into the load, "?" when unknown.
func (r *chaosRun) at(t time.Time) string {
	if t.IsZero() {
		return "?"
	}
	return fmt.Sprintf("%.3fs", r.since(t))
}

func (r *chaosRun) storedAt(fs []fire) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = r.at(f.stored)
	}
	return strings.Join(s, ", ")
}

// WriteText prints a result for people.
func (r *ChaosResult) WriteText(w io.Writer) {
	c := r.Config
	topo := "a standalone nats-server"
	if c.Servers > 1 {
		topo = fmt.Sprintf("a cluster of %d nats-servers, streams R%d", c.Servers, c.JSReplicas)
	}
	fmt.Fprintf(w, "chaos: %s, %d chime replicas, %gs of load: %g one-shots/s over %d agents, %d repeating every %dms, %g waits/s\n",
		topo, c.Replicas, c.DurationS, c.Rate, c.Agents, c.Repeating, c.IntervalMs, c.WaitRate)
	if len(c.Partition) > 0 {
		fmt.Fprintf(w, "partitions every %gs in turn: %s, each cut for %gs; grace %gs; load began %s\n", c.EveryS, strings.Join(c.Partition, ","), c.DownS, c.GraceS, c.LoadStart.Format(time.RFC3339Nano))
	} else if len(c.Kill) > 0 {
		fmt.Fprintf(w, "kills every %gs in turn: %s, down %gs; grace %gs; load began %s\n", c.EveryS, strings.Join(c.Kill, ","), c.DownS, c.GraceS, c.LoadStart.Format(time.RFC3339Nano))
	} else {
		fmt.Fprintf(w, "no kills; grace %gs; load began %s\n", c.GraceS, c.LoadStart.Format(time.RFC3339Nano))
	}
	t := r.Timers
	fmt.Fprintf(w, "timers created: %d (%d one-shot, %d repeating; %d one-shots cancelled; %d created without a reply, %d creates failed)\n",
		t.Created, t.OneShot, t.Repeating, t.Cancelled, t.Unacknowledged, t.CreateFailed)
	fmt.Fprintf(w, "expected deliveries: %d (one-shots not cancelled %d, repeating occurrences by fire_count %d)\n",
		t.Expected, t.ExpectedOneShot, t.ExpectedRepeating)
	fmt.Fprintf(w, "delivered: %d  lost: %d  duplicated: %d  not in the record: %d  unknown: %d  acknowledged without record: %d\n",
		t.Delivered, t.Lost, t.Duplicated, t.Unapplied, t.Unknown, t.MissingRecords)
	fmt.Fprintf(w, "cancelled but delivered: %d due before the cancel's ack (raced); %d due after it (fired after cancel, up to %.0f ms after the ack; %d more than 2 s after)\n",
		t.RacedCancel, t.FiredAfterCancel, t.FiredAfterCancelMaxMs, t.CancelBoundBroken)
	fmt.Fprintf(w, "cadence ticks not covered by a catch-up fire: %d of %d\n", t.TicksNotCovered, t.CadenceTicks)
	if t.Calendar > 0 {
		fmt.Fprintf(w, "calendar timers: %d; scheduled times not covered by a catch-up fire: %d of %d; stored under two occurrences: %d\n",
			t.Calendar, t.CalendarTicksNotCovered, t.CalendarTicks, t.CalendarTimesTwice)
	}
	fmt.Fprintf(w, "late (>2s after due): %d  lateness ms: p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n",
		t.Late, t.LatenessMs.P50, t.LatenessMs.P90, t.LatenessMs.P99, t.LatenessMs.Max)
	wt := r.Waits
	fmt.Fprintf(w, "waits: created %d (%d requests failed), completed %d, cancelled %d, lost %d, duplicated %d, late %d  lateness ms: p50 %.1f  p99 %.1f  max %.1f\n",
		wt.Created, wt.RequestFailed, wt.Completed, wt.Cancelled, wt.Lost, wt.Duplicated, wt.Late, wt.LatenessMs.P50, wt.LatenessMs.P99, wt.LatenessMs.Max)
	q := r.Requests
	fmt.Fprintf(w, "requests: %d (retried %d: unavailable %d, internal %d, timeouts %d, no responders %d, other %d; cancels failed %d)\n",
		q.Requests, q.Retries, q.Unavailable, q.Internal, q.Timeouts, q.NoResponders, q.OtherErrors, q.CancelFailed)
	if r.OtherDeliveries > 0 {
		fmt.Fprintf(w, "other inbox messages: %d\n", r.OtherDeliveries)
	}
	if len(r.LostShards) > 0 {
		var parts []string
		for _, l := range r.LostShards {
			parts = append(parts, fmt.Sprintf("%d:%d (%s)", l.Shard, l.Lost, cmp.Or(l.Holder, "none")))
		}
		fmt.Fprintf(w, "lost by shard (shard:lost (lease holder at the read)): %s\n", strings.Join(parts, " "))
	}
	total := 0
	var byKind []string
	for _, k := range sortedKinds(r.KillsByKind) {
		total += r.KillsByKind[k]
		byKind = append(byKind, fmt.Sprintf("%s %d", k, r.KillsByKind[k]))
	}
	parts := 0
	var partsByKind []string
	for _, k := range sortedKinds(r.PartitionsByKind) {
		parts += r.PartitionsByKind[k]
		partsByKind = append(partsByKind, fmt.Sprintf("%s %d", k, r.PartitionsByKind[k]))
	}
	switch {
	case total > 0:
		fmt.Fprintf(w, "kills: %d (%s)\n", total, strings.Join(byKind, ", "))
	case parts > 0:
		fmt.Fprintf(w, "partitions: %d (%s)\n", parts, strings.Join(partsByKind, ", "))
	default:
		fmt.Fprintf(w, "kills: 0\n")
	}
	if len(r.Kills) > 0 {
		fmt.Fprintf(w, "  takeover: the longest a delivery due while the target was down (kill to back, or to the election if later) waited past its due time\n")
		fmt.Fprintf(w, "  late/lost/dup: of everything due from this kill to the next; no reply: timers created then whose create timed out\n")
		fmt.Fprintf(w, "  (before the first kill: late %d, lost %d, dup %d, no reply %d)\n",
			r.BeforeKills.Late, r.BeforeKills.Lost, r.BeforeKills.Duplicated, r.BeforeKills.CreatedWithoutReply)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "  n\tat\tkind\ttarget\telected\tback\tcurrent\tdue in outage\ttakeover\tlate\tlost\tdup\tno reply\t\n")
		for _, k := range r.Kills {
			target := k.Target
			if k.Stream != "" {
				target += " (" + k.Stream + ")"
			}
			fmt.Fprintf(tw, "  %d\t%.1fs\t%s\t%s\t%s\t%s\t%s\t%d\t%.0fms\t%d\t%d\t%d\t%d\t\n", k.N, k.AtS, k.Kind, target,
				msOrDash(k.ElectedMs), msOrDash(k.BackMs), msOrDash(k.CaughtUpMs), k.DueInOutage, k.TakeoverMs, k.Late, k.Lost, k.Duplicated, k.CreatedWithoutReply)
		}
		tw.Flush()
		if parts > 0 {
			fmt.Fprintf(w, "  each partition, cut to heal (back is the heal): of the fires (timer fires and wait ends) due during it, how many were stored in the inbox before the heal, and the latest of them\n")
			for _, k := range r.Kills {
				c := k.Partition
				if c == nil || k.Skipped {
					continue
				}
				acks := "?"
				if c.DuplicateAcks != nil {
					acks = strconv.Itoa(*c.DuplicateAcks)
				}
				fmt.Fprintf(w, "  partition %d %s %s (%s) at %.1fs for %.1fs: due during it %d, stored during it %d (%.1f%%), max lateness %.0f ms; requests failed until %s after the cut; lost %d, dup %d (due until the next fault); duplicate acks %s\n",
					k.N, k.Kind, k.Target, c.Addr, k.AtS, float64(k.BackMs)/1000, c.Due, c.Stored, c.StoredPct, c.MaxLateMs, msOrDash(c.FailedUntilMs), k.Lost, k.Duplicated, acks)
			}
		}
		for _, k := range r.Kills {
			for _, e := range k.Errors {
				fmt.Fprintf(w, "  kill %d error: %s\n", k.N, firstLine(e))
			}
		}
	}
	if wk := r.WorstTakeover; wk != nil {
		fmt.Fprintf(w, "worst takeover: %.0f ms, kill %d (%s %s)\n", wk.TakeoverMs, wk.Kill, wk.Kind, wk.Target)
	}
	var logs []string
	for _, id := range slices.Sorted(maps.Keys(r.ReplicaLogs)) {
		l := r.ReplicaLogs[id]
		line := fmt.Sprintf("%s: %d starts, %d WARN, %d ERROR", id, l.Starts, l.Warn, l.Error)
		if l.Stalls > 0 {
			line += fmt.Sprintf(" (%d of them stalled shards)", l.Stalls)
		}
		logs = append(logs, line)
	}
	fmt.Fprintf(w, "replica logs: %s\n", strings.Join(logs, "; "))
	if len(r.DuplicateAcks) > 0 {
		var acks []string
		total := 0
		for _, id := range slices.Sorted(maps.Keys(r.DuplicateAcks)) {
			acks = append(acks, fmt.Sprintf("%s %d", id, r.DuplicateAcks[id]))
			total += r.DuplicateAcks[id]
		}
		fmt.Fprintf(w, "fire publishes acknowledged as duplicates (chime_fire_duplicates_total): %d (%s)\n", total, strings.Join(acks, ", "))
	}
	if len(r.NotCurrentAtRead) > 0 {
		fmt.Fprintf(w, "read while a replica was behind (records read from it may be stale: lost and unapplied may be overcounted): %s\n", strings.Join(r.NotCurrentAtRead, ", "))
	}
	if len(r.Examples) > 0 {
		fmt.Fprintf(w, "examples (times are seconds into the load):\n")
		for _, e := range r.Examples {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	if r.OK {
		fmt.Fprintf(w, "result: OK, nothing lost, duplicated or skipped\n")
	} else {
		fmt.Fprintf(w, "result: FAILED, %d lost, %d duplicated, %d ticks skipped\n", r.Lost, r.Duplicated, r.Timers.TicksNotCovered+r.Timers.CalendarTicksNotCovered)
	}
	if r.WorkDir != "" {
		fmt.Fprintf(w, "work dir (server and replica logs): %s\n", r.WorkDir)
	}
}

func msOrDash(v int64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%dms", v)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
