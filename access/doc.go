// Package access owns who may do what: the principals (an agent, an
// operator, a callback sender; chime itself is the NATS service user), the
// subjects each may publish and subscribe to, the tokens that name them
// (operator tokens from CHIME_OPERATOR_TOKENS_FILE, agent tokens issued by
// operators and kept as SHA-256 in chime_tokens, callback tokens), and the
// NATS auth callout through which the server itself enforces those rights
// on every connection. HTTP checks the same tokens.
package access
