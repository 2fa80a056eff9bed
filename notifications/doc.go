// Package notifications owns the notifications agents send their users
// (Agent Zero's notify_user): the records in the chime_notifications KV
// bucket, each agent's guid, the per-agent limit, and the change feed UIs
// follow (history since a sequence, Server-Sent Events, and
// agent.<id>.notifications).
//
// # The update sequence
//
// The sequence is JetStream's own: the bucket's stream sequence. Every
// change is one message of the bucket, so its sequence is unique, given by
// the server, and only grows, whichever replica wrote it:
//   - a create, an update in place and a mark-read are puts of
//     <agent>.<notification> (the notification's seq is its revision);
//   - an eviction is a delete marker of that key, which stays in the
//     stream: a reader behind finds the removal after its sequence;
//   - a clear writes the agent's record (<agent>: a new guid) and then
//     purges the agent's older messages. A notification whose revision is
//     below the agent's reset point counts as gone even if the purge never
//     ran (a crash), so the purge is only garbage collection.
//
// The bucket keeps one message per key (History 1), so "what changed
// after N" is exactly the messages after N: a key changed twice after N
// shows once, at its last change, and a key changed before N and not since
// is not there. Nothing is missed and nothing goes backwards.
//
// Removal markers are compacted so that they do not grow without bound:
// once an agent has more than twice its limit of them, the older ones
// (every one older than its oldest live notification, but never the
// newest Max) are purged after the agent's reset point is raised past them
// by CAS. The compaction runs in the background, one agent at a time, not
// on the reply path of the notify that finds it due: its purge holds the
// stream while it scans the agent's span of it, and nothing a reader sees
// depends on when it runs. A reader whose since is below the reset point (it was cleared,
// or it is so far behind that every notification it knew was evicted
// since) is told to replace its list: the history answer has cleared set,
// the SSE replay starts with a clear.
//
// # The limit
//
// After each write the writer waits until its replica's view holds its
// own revision, then evicts the agent's oldest notifications (creation
// order) beyond Max, each by a delete that expects the revision the view
// saw (Nats-Expected-Last-Subject-Sequence). Two replicas creating at
// once both evict down to Max from views that are prefixes of one
// sequence, so the oldest ones are chosen by both, and the expected
// revision lets only one delete of each land: never twice, and the limit
// is exceeded only between a write and its eviction. A crash between the
// two is mended by the agent's next create, which evicts everything
// beyond Max.
//
// # Views
//
// Every replica keeps the whole bucket in memory through one watch
// (internal/kvwatch): histories are read there, after waiting until the
// view holds the stream's last sequence (so any replica answers with what
// any other wrote), and the SSE feeds are fanned out from it with each
// change encoded once. A feed whose client does not keep up (its buffer
// of changes is full) is dropped, not buffered: the client reconnects with
// Last-Event-ID and replays what it missed.
package notifications
