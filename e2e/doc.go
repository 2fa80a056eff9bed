// Package e2e holds chime's end-to-end tests: the built binary as real child
// processes against a real nats-server, killed and restarted for real.
package e2e
