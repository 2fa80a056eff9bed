package api

import (
	"context"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/subjects"
)

// Callback accepts a callback (see callbacks.Service.Accept), bounded by
// the request timeout and counted; a body over the callback limit is
// refused first, on NATS as on HTTP. The token goes no further than the
// lookup: not into a log line, a subject or a label.
func (o *Operations) Callback(ctx context.Context, surface string, req callbacks.Request) (*callbacks.CallbackReply, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var reply *callbacks.CallbackReply
	err := o.checkBody(callbackAction, len(req.Body))
	switch {
	case err != nil:
	case o.callbacks == nil:
		err = callbacks.ErrCallbackRejected
	default:
		reply, err = o.callbacks.Accept(ctx, req)
	}
	err = o.finish(surface+":callback."+req.Mode.Route(), "callback", err, "surface", surface, "mode", string(req.Mode))
	if code := subjects.AsError(err).Code; err != nil && code != subjects.CodeInternal && code != subjects.CodeUnavailable {
		// A delivery refused is the operator's to know of (finish logs
		// the failures); never the token, which is the caller's secret.
		o.refusedCallbacks.Do(1, func(n int64) {
			o.log.Info("callbacks refused", "surface", surface, "mode", string(req.Mode), "last", code, "refused", n)
		})
	}
	return reply, err
}
