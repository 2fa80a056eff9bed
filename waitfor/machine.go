package waitfor

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// The registration state machine: pure transitions of one registration,
// each reporting whether it changed it. The store applies them by CAS, so
// whichever replica reads a newer revision decides again from that.
//
//	prepared --report--> active --wake--> woken
//	prepared --operator message--> invalidated
//	prepared|active --newer WaitFor in the scope, stop--> cancelled
//
// Only active wakes, and nothing leaves woken, cancelled or invalidated.

// wake resumes an active registration by cause.
func wake(w *WaitFor, cause WakeCause, now time.Time) bool {
	if w.Status != WaitForActive {
		return false
	}
	w.Status, w.WokenBy = WaitForWoken, &cause
	stamp(w, now, true)
	return true
}

// see records the result of set member taskID on an active wait.tasks
// and, once that satisfies the set, wakes it by cause in the same change:
// one CAS, so the result that completes the set wakes it exactly once.
func see(w *WaitFor, taskID string, cause WakeCause, now time.Time) bool {
	if w.Status != WaitForActive || !slices.Contains(w.Resources, taskID) || slices.Contains(w.Seen, taskID) {
		return false
	}
	w.Seen = append(slices.Clip(w.Seen), taskID)
	if satisfied(w) {
		return wake(w, cause, now)
	}
	stamp(w, now, false)
	return true
}

// satisfied reports whether a wait.tasks has the results it waits for:
// any one, or all.
func satisfied(w *WaitFor) bool {
	if len(w.Resources) == 0 {
		return false
	}
	if w.Mode == WaitModeAny {
		return len(w.Seen) > 0
	}
	for _, id := range w.Resources {
		if !slices.Contains(w.Seen, id) {
			return false
		}
	}
	return true
}

// end finishes a live registration as status for reason.
func end(w *WaitFor, status WaitForStatus, reason, replacedBy string, now time.Time) bool {
	if !w.Live() {
		return false
	}
	w.Status, w.EndReason, w.ReplacedBy = status, reason, replacedBy
	stamp(w, now, true)
	return true
}

// invalidate ends a prepared registration whose report an operator
// message overtook; a committed one is left to be woken by that message.
func invalidate(w *WaitFor, now time.Time) bool {
	if w.Status != WaitForPrepared {
		return false
	}
	return end(w, WaitForInvalidated, EndOperatorMessage, "", now)
}

// commit makes a prepared registration active with its final report. A
// repeat of the committed report changes nothing and is no error.
func commit(w *WaitFor, text string, now time.Time) (bool, error) {
	switch {
	case w.Status == WaitForPrepared:
		w.Status, w.Report = WaitForActive, text
		stamp(w, now, false)
		return true, nil
	case w.Delivery == DeliveryFinal && w.Report == text && (w.Status == WaitForActive || w.Status == WaitForWoken):
		return false, nil
	}
	return false, reportRefused(w)
}

// markRecheck records that an active registration's recheck is delivered.
func markRecheck(w *WaitFor, now time.Time) bool {
	if w.Status != WaitForActive || w.RecheckSent || w.RecheckAfterMs == 0 {
		return false
	}
	w.RecheckSent = true
	stamp(w, now, false)
	return true
}

func stamp(w *WaitFor, now time.Time, ended bool) {
	now = now.UTC()
	w.UpdatedAt = now
	if ended {
		w.EndedAt = &now
	}
}

// reportRefused says why a registration's report cannot commit.
func reportRefused(w *WaitFor) error {
	inv := func(msg string) error { return &subjects.Error{Code: CodeWaitForInvalidated, Message: msg} }
	switch {
	case w.Delivery != DeliveryFinal:
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("WaitFor %s has delivery silent: it takes no report", w.ID)}
	case w.Status == WaitForInvalidated:
		return inv(fmt.Sprintf("WaitFor %s was invalidated by a concurrent operator message; its report did not commit", w.ID))
	case w.EndReason == EndWaitForReplaced:
		return inv(fmt.Sprintf("WaitFor %s was replaced by a newer WaitFor %s; its report did not commit", w.ID, w.ReplacedBy))
	case w.Status == WaitForCancelled:
		return inv(fmt.Sprintf("WaitFor %s was cancelled (%s); its report did not commit", w.ID, w.EndReason))
	}
	return inv(fmt.Sprintf("WaitFor %s is already committed with another report", w.ID))
}

// interventionAction is the action of an intervention envelope.
func interventionAction(env *subjects.Envelope) string {
	var d struct {
		Action string `json:"action"`
	}
	_ = json.Unmarshal(env.Data, &d)
	return d.Action
}

// operatorMessage reports whether env is operator input: an intervention
// message or an operator's answer.
func operatorMessage(env *subjects.Envelope) bool {
	return (env.Kind == subjects.KindIntervention && interventionAction(env) == interventions.ActionMessage) || env.Kind == subjects.KindAnswer
}

// Matches reports whether the inbox envelope env, stored at stream
// sequence seq, is the wake w waits for. Only envelopes stored after the
// registration was made count, except a timer's, which counts by fire.
func Matches(w *WaitFor, env *subjects.Envelope, seq uint64) bool {
	if env.AgentID != w.AgentID || (w.Wake != WakeTimer && seq <= w.SinceSeq) || !fits(w.Wake, w.Resource, w.Resources, env) {
		return false
	}
	if w.Wake != WakeTimer {
		return true
	}
	var d timers.TimerFiredData
	return json.Unmarshal(env.Data, &d) == nil && d.Occurrence > w.AfterFire
}

// fits reports whether env is of the kind a wait on wake and resource (or
// the set resources) wants, whenever it was stored.
func fits(wake WakeKind, resource string, resources []string, env *subjects.Envelope) bool {
	switch wake {
	case WakeOperatorInput:
		return operatorMessage(env)
	case WakeTaskResult:
		if len(resources) > 0 {
			return env.Kind == subjects.KindTaskResult && slices.Contains(resources, env.Source.ID)
		}
		return env.Kind == subjects.KindTaskResult && env.Source.ID == resource
	case WakeExternal:
		return env.Kind == subjects.KindWakeHint || env.Kind == subjects.KindMessage
	case WakeTimer:
		return env.Kind == subjects.KindTimerFired && env.Source.ID == resource
	case WakeSystem:
		return env.Kind == subjects.KindSystemWake
	case WakeMonitor:
		// Its end wakes it too: a monitor that has stopped sends no more
		// events, and a wait left standing on it would wait for ever.
		return (env.Kind == subjects.KindMonitorEvent || env.Kind == subjects.KindMonitorStopped) && env.Source.ID == resource
	}
	return false
}

// concernsAny reports whether env can change any registration at all:
// envelopes of other kinds (a wait's end, chime's own wait_woken and
// recheck) are passed over without reading the agent's index.
func concernsAny(env *subjects.Envelope) bool {
	switch env.Kind {
	case subjects.KindIntervention, subjects.KindTaskResult, subjects.KindTimerFired,
		subjects.KindWakeHint, subjects.KindMessage, subjects.KindSystemWake,
		subjects.KindMonitorEvent, subjects.KindMonitorStopped:
		return true
	}
	return operatorMessage(env)
}

// concerns reports whether env can change a registration waiting on wake
// and resource: its wake, or an intervention or answer, which may stop it
// or invalidate its report. The consumer reads only those records.
func concerns(wake WakeKind, resource string, resources []string, env *subjects.Envelope) bool {
	return env.Kind == subjects.KindIntervention || operatorMessage(env) || fits(wake, resource, resources, env)
}

// advance is the change a matching envelope makes: a set member's result
// is seen (waking the set once satisfied); any other match wakes.
func advance(w *WaitFor, env *subjects.Envelope, now time.Time) bool {
	if len(w.Resources) > 0 {
		return see(w, env.Source.ID, causeOf(env), now)
	}
	return wake(w, causeOf(env), now)
}

// causeOf is the wake cause env gives.
func causeOf(env *subjects.Envelope) WakeCause {
	return WakeCause{Kind: env.Kind, EnvelopeID: env.ID, Source: env.Source}
}
