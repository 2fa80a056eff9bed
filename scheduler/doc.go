// Package scheduler owns time: the in-memory index of the due timers and
// waits of the shards a replica holds, built from watches of the timers and
// waits buckets, the shard leases that decide which replica holds and fires
// which records, and the loop that, at each due time, publishes the fire to
// the agent's inbox and then writes it into the record.
//
// Firing never polls storage. A replica keeps entries only for the shards it
// holds, so N replicas hold N times what one does; a shard it gains is
// loaded by replaying the watches and fires only once loaded, overdue
// timers at once. Every publish carries a stable message ID (envelope
// timer_<timer>_<occurrence>): two owners that overlap for a moment, or a
// re-armed retry, publish the same IDs and JetStream keeps one. It also
// counts every shard's active records per agent, from a hash of each, for
// the create quotas.
package scheduler
