// Package subjects owns what every feature of chime's wire contract shares:
// the NATS subject names (agent actions' prefix, internal events, callback
// ingress) as builders and parsers, ID validation, the inbox envelope and
// its kinds, the one error shape every reply uses, strict JSON decoding,
// listings' limits and cursors, and request_id keys.
//
// A feature's own records, request and reply types, limits, texts and
// envelope builders live in the feature's package (timers, waits,
// interventions, waitfor, tasks, questions, notifications, callbacks,
// agents, deliveries). Nothing here talks to NATS.
package subjects
