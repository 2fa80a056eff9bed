// Package waitfor owns Holon's WaitFor: an agent yields until one named
// wake (operator input, a task's result, an external event, a timer, a
// system wake, and chime's own: a monitor's event or end) instead of
// polling.
//
// Registrations live in the chime_waitfor bucket (rec.<agent>.<wait>),
// with one index entry per scope (idx.<agent>.agent, or
// idx.<agent>.item.<work item>) naming its live registration: a newer
// WaitFor in a scope replaces the older, which ends as cancelled with
// Holon's reason wait_for_replaced. Every change is a CAS through the pure
// transitions in machine.go, so a wake, a report, a stop and a replacement
// racing on any replicas leave one outcome.
//
// Wakes come through one path: a durable consumer on the inbox stream reads
// every stored envelope and matches it against the agent's live
// registrations, found in the replica's in-memory view of the index (see
// Index for why a lagging view misses nothing); a match resumes a
// registration once and delivers its one wait_woken envelope (its ID
// derives from the registration). An envelope of an agent the view has
// no entry for costs nothing while a recent catch-up of the view vouches
// for it (Index.Absent). A registration catches up, when it becomes
// active and a short window after writing its entry, on the envelopes
// stored since it was made, so a wake racing its registration is not lost.
// A recheck is a JetStream message schedule on the WaitFor stream: the
// engine delivers it when due, and the recheck consumer delivers one
// recheck envelope unless the registration ended first.
package waitfor
