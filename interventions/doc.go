// Package interventions owns the intervention: an operator's message,
// pause, resume or stop for an agent, its request and its event on
// intervention.apply.<agent>, and the inbox delivery of the intervention
// itself. What an intervention does to waits is the waits package's, and
// to WaitFor registrations the waitfor package's: each reacts to the event.
package interventions
