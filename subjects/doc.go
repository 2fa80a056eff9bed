// Package subjects owns chime's wire contract: the NATS subjects of DESIGN.md
// as builders and parsers, ID validation, the JSON message and record types,
// and the one error shape every reply uses.
//
// Nothing here talks to NATS; it is the vocabulary the other packages share,
// so a subject or a field is spelled in exactly one place.
package subjects
