package waitfor

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
)

// TestStateMachine drives registrations of one agent through random
// WaitFors (silent or final), reports, wakes (repeated too), operator
// messages, stops and restarts (each record decoded afresh, as after a
// chime restart), as the store applies them, and checks that a
// registration is woken at most once, only from active, and that nothing
// changes an ended one.
func TestStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		var recs []*WaitFor
		live := map[string]int{} // scope -> index in recs: the agent's index
		woken := map[string]int{}
		frozen := map[int]WaitFor{}
		type event struct {
			env subjects.Envelope
			seq uint64
		}
		var events []event // every wake event so far, to repeat
		wakes := []WakeKind{WakeOperatorInput, WakeExternal, WakeSystem, WakeTaskResult, WakeMonitor}
		taskIDs := []string{"t1", "t2", "t3"}
		monitorIDs := []string{"m1", "m2"}

		// apply is what the store does: a change under CAS, then checks.
		apply := func(i int, change func(*WaitFor) bool) {
			before := *recs[i]
			changed := change(recs[i])
			if !changed && !reflect.DeepEqual(before, *recs[i]) {
				t.Fatalf("%s: unchanged, yet different", before.ID)
			}
			if f, ok := frozen[i]; ok && !reflect.DeepEqual(f, *recs[i]) {
				t.Fatalf("%s changed after it ended (%s): %+v", f.ID, f.Status, *recs[i])
			}
			if changed && recs[i].Status == WaitForWoken {
				if before.Status != WaitForActive {
					t.Fatalf("%s woken from %s", before.ID, before.Status)
				}
				woken[before.ID]++
				if woken[before.ID] > 1 {
					t.Fatalf("%s woken twice", before.ID)
				}
			}
			// A set wakes exactly when its results satisfy it, and sees
			// each member once.
			if w := recs[i]; len(w.Resources) > 0 {
				// Seen holds distinct members (checked below): all is
				// satisfied when it holds every one.
				want := len(w.Seen) == len(w.Resources) || (w.Mode == WaitModeAny && len(w.Seen) > 0)
				if (w.Status == WaitForWoken) != want && w.Status != WaitForCancelled && w.Status != WaitForInvalidated {
					t.Fatalf("%s is %s with %v seen of %s %v", w.ID, w.Status, w.Seen, w.Mode, w.Resources)
				}
				for k, id := range w.Seen {
					if !slices.Contains(w.Resources, id) || slices.Contains(w.Seen[:k], id) {
						t.Fatalf("%s saw %v of %v", w.ID, w.Seen, w.Resources)
					}
				}
			}
			if recs[i].Ended() {
				frozen[i] = *recs[i]
			}
		}
		deliver := func(env subjects.Envelope, seq uint64) {
			for _, i := range live {
				w := recs[i]
				switch {
				case env.Kind == subjects.KindIntervention && interventionAction(&env) == interventions.ActionStop:
					apply(i, func(w *WaitFor) bool {
						return end(w, WaitForCancelled, EndAgentStopped, "", now)
					})
				case operatorMessage(&env) && w.Status == WaitForPrepared:
					apply(i, func(w *WaitFor) bool { return invalidate(w, now) })
				case Matches(w, &env, seq):
					apply(i, func(w *WaitFor) bool { return advance(w, &env, now) })
				}
			}
		}
		seq := uint64(0)
		steps := rapid.IntRange(1, 60).Draw(t, "steps")
		for n := range steps {
			now = now.Add(time.Second)
			switch rapid.IntRange(0, 6).Draw(t, "op") {
			case 0: // a new WaitFor replaces its scope's
				scope := rapid.SampledFrom([]string{"", "w1"}).Draw(t, "scope")
				delivery := rapid.SampledFrom(Deliveries()).Draw(t, "delivery")
				w := &WaitFor{ID: fmt.Sprintf("wf_%d", n), AgentID: "a", Wake: rapid.SampledFrom(wakes).Draw(t, "wake"),
					Delivery: delivery, WorkItemID: scope, Status: WaitForActive, SinceSeq: seq}
				if w.Wake == WakeTaskResult {
					// wait.tasks over a set of the tasks, none seen yet
					w.Resources = rapid.SliceOfNDistinct(rapid.SampledFrom(taskIDs), 1, len(taskIDs), rapid.ID[string]).Draw(t, "set")
					w.Mode = rapid.SampledFrom([]string{WaitModeAll, WaitModeAny}).Draw(t, "mode")
				}
				if w.Wake == WakeMonitor {
					w.Resource = rapid.SampledFrom(monitorIDs).Draw(t, "monitor")
				}
				if delivery == DeliveryFinal {
					w.Status = WaitForPrepared
				}
				recs = append(recs, w)
				if old, ok := live[scope]; ok {
					apply(old, func(o *WaitFor) bool {
						return end(o, WaitForCancelled, EndWaitForReplaced, w.ID, now)
					})
				}
				live[scope] = len(recs) - 1
			case 1: // a report for any registration so far
				if len(recs) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(recs)-1).Draw(t, "report")
				text := rapid.SampledFrom([]string{"done", "other"}).Draw(t, "text")
				apply(i, func(w *WaitFor) bool {
					changed, err := commit(w, text, now)
					if err == nil && w.Status == WaitForActive && w.Report != text {
						t.Fatalf("%s committed %q, reported %q", w.ID, w.Report, text)
					}
					return changed
				})
			case 2: // a wake event
				kind := rapid.SampledFrom([]string{subjects.KindAnswer, subjects.KindWakeHint, subjects.KindSystemWake, subjects.KindWaitWoken, subjects.KindTaskResult,
					subjects.KindMonitorEvent, subjects.KindMonitorStopped}).Draw(t, "kind")
				seq++
				env := subjects.Envelope{ID: fmt.Sprintf("env_%d", seq), AgentID: "a", Kind: kind}
				if kind == subjects.KindTaskResult {
					// a task's result, or a second envelope of the same result
					env.Source = subjects.Source{Type: "task", ID: rapid.SampledFrom(taskIDs).Draw(t, "task")}
				}
				if kind == subjects.KindMonitorEvent || kind == subjects.KindMonitorStopped {
					env.Source = subjects.Source{Type: "monitor", ID: rapid.SampledFrom(monitorIDs).Draw(t, "monitor")}
				}
				events = append(events, event{env, seq})
				deliver(env, seq)
			case 3: // a repeat of an earlier event (a redelivery)
				if len(events) == 0 {
					continue
				}
				ev := events[rapid.IntRange(0, len(events)-1).Draw(t, "repeat")]
				deliver(ev.env, ev.seq)
			case 4: // stop
				seq++
				data, _ := json.Marshal(map[string]string{"action": interventions.ActionStop})
				deliver(subjects.Envelope{ID: fmt.Sprintf("iv_%d", seq), AgentID: "a", Kind: subjects.KindIntervention, Data: data}, seq)
			case 5: // restart: every record read back from its stored bytes
				for i, w := range recs {
					b, err := json.Marshal(w)
					if err != nil {
						t.Fatal(err)
					}
					var back WaitFor
					if err := json.Unmarshal(b, &back); err != nil {
						t.Fatal(err)
					}
					recs[i] = &back
				}
			case 6: // a recheck
				if len(recs) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(recs)-1).Draw(t, "recheck")
				recs[i].RecheckAfterMs = 1 // as registered with one (a field only the registration sets)
				if f, ok := frozen[i]; ok {
					f.RecheckAfterMs = 1
					frozen[i] = f
				}
				apply(i, func(w *WaitFor) bool { return markRecheck(w, now) })
			}
		}
	})
}
