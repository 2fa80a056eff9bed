// Package consumer owns delivery: the one JetStream consumer machinery
// every feature's durable consumer runs on (a bounded worker pool that acks
// only after a handler's effects are durable, terminates poison and naks
// the rest for redelivery), and Inbox, the one path by which any envelope
// reaches an agent's inbox stream under its stable ID.
//
// Features (timers, waits, callbacks) own their handlers; this package
// knows nothing of their records.
package consumer
