// Package scheduler owns time: the in-memory index of due timers, built
// from a watch of the timers bucket on every replica, the shard leases that
// decide which replica fires which timers, and the loop that, at each
// timer's due time, publishes the timer_fired envelope to the agent's inbox
// and a timer.fire event for the record update.
//
// Firing never polls storage. Every replica indexes every active timer, so a
// replica that takes over a shard can fire its overdue timers at once. Both
// publishes carry stable message IDs (envelope timer_<timer>_<occurrence>,
// event <agent>.<timer>:<occurrence>); two owners that overlap for a moment,
// or a re-armed retry, publish the same IDs and JetStream keeps one.
package scheduler
