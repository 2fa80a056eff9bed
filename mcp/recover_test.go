package mcp

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestRecoverPanics: a handler's panic is the request's internal error,
// not the replica's end.
func TestRecoverPanics(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	h := s.recoverPanics(func(context.Context, string, sdk.Request) (sdk.Result, error) {
		var p *taskParams
		return nil, errors.New(p.TaskID) // a nil dereference, as tasks/get's was
	})
	res, err := h(context.Background(), "tasks/get", nil)
	if e, ok := errors.AsType[*jsonrpc.Error](err); !ok || e.Code != jsonrpc.CodeInternalError || res != nil {
		t.Errorf("a panicking handler: %v %v", res, err)
	}
	ok := s.recoverPanics(func(context.Context, string, sdk.Request) (sdk.Result, error) { return &ack{}, nil })
	if res, err := ok(context.Background(), "tasks/get", nil); err != nil || res == nil {
		t.Errorf("a handler that returns: %v %v", res, err)
	}
}
