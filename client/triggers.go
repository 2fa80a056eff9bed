package client

import (
	"context"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/callbacks"
)

// Start starts the agent and returns its new default triggers with their
// URLs: hand them to the external systems that should reach this agent.
func (c *Client) Start(ctx context.Context) (*callbacks.LifecycleReply, error) {
	var r callbacks.LifecycleReply
	return &r, c.call(ctx, callbacks.ActionLifecycleStart, struct{}{}, &r)
}

// Stop stops the agent and revokes all its triggers.
func (c *Client) Stop(ctx context.Context) (*callbacks.LifecycleReply, error) {
	var r callbacks.LifecycleReply
	return &r, c.call(ctx, callbacks.ActionLifecycleStop, struct{}{}, &r)
}

// CreateTrigger issues an extra trigger; its URL is in the result, once.
func (c *Client) CreateTrigger(ctx context.Context, mode callbacks.DeliveryMode, label string) (*callbacks.TriggerView, error) {
	var r callbacks.TriggerView
	return &r, c.call(ctx, callbacks.ActionTriggerCreate, callbacks.CreateTriggerRequest{Mode: string(mode), Label: label}, &r)
}

// ResetCallback revokes the agent's default trigger of mode and issues a
// new one.
func (c *Client) ResetCallback(ctx context.Context, mode callbacks.DeliveryMode) (*callbacks.ResetReply, error) {
	var r callbacks.ResetReply
	return &r, c.call(ctx, callbacks.ActionTriggerReset, callbacks.ResetTriggerRequest{Mode: string(mode)}, &r)
}

// CancelTrigger revokes a trigger; cancelling a revoked one is a no-op.
func (c *Client) CancelTrigger(ctx context.Context, triggerID string) (*callbacks.TriggerView, error) {
	var r callbacks.TriggerView
	return &r, c.call(ctx, callbacks.ActionTriggerCancel, callbacks.TriggerRef{ID: triggerID}, &r)
}

// ListTriggers returns the agent's triggers (without URLs: tokens are not
// kept).
func (c *Client) ListTriggers(ctx context.Context) ([]callbacks.TriggerView, error) {
	var r struct {
		Triggers []callbacks.TriggerView `json:"triggers"`
	}
	return r.Triggers, c.call(ctx, callbacks.ActionTriggerList, struct{}{}, &r)
}

// IssueToken issues a new token for the agent (an operator's right): the
// token is in the result, once.
func (c *Client) IssueToken(ctx context.Context) (*access.IssuedToken, error) {
	var r access.IssuedToken
	return &r, c.call(ctx, agents.ActionTokenIssue, struct{}{}, &r)
}

// RevokeTokens revokes every token of the agent (an operator's right).
func (c *Client) RevokeTokens(ctx context.Context) (*access.RevokedTokens, error) {
	var r access.RevokedTokens
	return &r, c.call(ctx, agents.ActionTokenRevoke, struct{}{}, &r)
}
