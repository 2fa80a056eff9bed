// Package scheduler owns time: the in-memory index of due timers, built
// from a watch of the timers bucket on every replica, the shard leases that
// decide which replica fires which timers, and the loop that publishes a
// timer.fire event at each timer's due time.
//
// Firing never polls storage. Every replica indexes every active timer, so a
// replica that takes over a shard can fire its overdue timers at once. A fire
// is published with Nats-Msg-Id <agent>.<timer>:<occurrence>; two owners that
// overlap for a moment publish the same ID and JetStream keeps one.
package scheduler
