// Package consumer owns delivery: the one JetStream consumer machinery
// every feature's durable consumer runs on (a bounded worker pool that acks
// only after a handler's effects are durable, keeps what it holds with
// in-progress acks, recovers handler panics, terminates poison and
// messages at their last delivery with a metric, naks the rest for a
// backed-off redelivery, and re-creates its consumer when it is deleted),
// Redelivery, the one delivery policy (AckWait, MaxDeliver, BackOff) of
// those consumers, and Inbox, the one path by which any envelope reaches
// an agent's inbox stream under its stable ID.
//
// Features (timers, waits, callbacks) own their handlers; this package
// knows nothing of their records.
package consumer
