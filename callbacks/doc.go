// Package callbacks owns callbacks from the outside world, whole: external
// triggers and the agent lifecycle that issues and revokes them (records in
// chime_triggers, keyed so that a token, by its SHA-256, and an agent's list
// are each one lookup), the capability tokens themselves (returned once,
// stored only as hashes), the in-memory index that checks a token without a
// storage round trip, the ingress that accepts a callback once it is stored,
// the consumer that turns it into a wake_hint or message delivery, and the
// protocol that coalesces wakes into the hint the agent has not consumed.
package callbacks
