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
// After each write the writer counts the agent's keys (without reading
// them); beyond Max it reads them and evicts the oldest notifications
// (creation order) beyond Max, each by a delete that expects the revision
// read (Nats-Expected-Last-Subject-Sequence). Two replicas creating at
// once both evict down to Max from reads of one sequence, so the oldest
// ones are chosen by both, and the expected revision lets only one delete
// of each land: never twice, and the limit is exceeded only between a
// write and its eviction. A crash between the two is mended by the
// agent's next create, which evicts everything beyond Max.
//
// # Reads from the store
//
// A replica holds no agent's notifications: every answer is read from the
// bucket when asked. A history is the stream's last sequence, then the
// agent's keys (<agent>.*) in batched direct gets filtered by subject (the
// server finds them through its per-subject index: the cost is the
// agent's own keys, whatever the fleet), then the agent's record. Detail
// bodies stay in JetStream; detail_html is made as each is read. A feed
// (SSE) is an ordered consumer of the followed agent's keys (every key for
// the all-agents feed) from its since on, so a replay is read as the
// client takes it; it keeps only each followed agent's guid and reset
// point (about 100 B an agent, at most 4096 agents once live, read again
// when forgotten). The agent list reads every key once per call. Memory
// thus grows with the requests and feeds being served, not with the
// fleet.
package notifications
