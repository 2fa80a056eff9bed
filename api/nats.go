package api

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/chime-nats/chime/subjects"
)

// Service is the micro service every replica registers.
type Service struct {
	ops  *Operations
	svc  micro.Service
	sem  chan struct{}
	ctx  context.Context
	once sync.Once
	err  error
}

// maxConcurrent bounds requests in flight per replica. micro calls a
// handler serially per subscription, so each request moves to its own
// goroutine, bounded here, to keep storage round trips overlapping.
const maxConcurrent = 1024

// StartService registers the chime micro service on nc.
func StartService(ctx context.Context, nc *nats.Conn, ops *Operations, version string) (*Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:        subjects.ServiceName,
		Version:     version,
		Description: "chime: timers, waits and callbacks for AI agents",
		QueueGroup:  subjects.QueueGroup,
	})
	if err != nil {
		return nil, fmt.Errorf("api: micro service: %w", err)
	}
	s := &Service{ops: ops, svc: svc, sem: make(chan struct{}, maxConcurrent), ctx: ctx}
	for _, action := range Actions() {
		name := strings.ReplaceAll(action, ".", "_")
		if err := svc.AddEndpoint(name, micro.HandlerFunc(s.handler(action)), micro.WithEndpointSubject(subjects.AgentWildcard(action))); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("api: endpoint %s: %w", name, err)
		}
	}
	return s, nil
}

func (s *Service) handler(action string) func(micro.Request) {
	return func(req micro.Request) {
		s.sem <- struct{}{}
		go func() {
			defer func() { <-s.sem }()
			agentID, err := subjects.ParseAgent(req.Subject())
			var res any
			if err == nil {
				res, err = s.ops.Do(s.ctx, "nats", action, agentID, req.Data())
			}
			if err != nil {
				e := subjects.AsError(err)
				_ = req.Error(strconv.Itoa(subjects.HTTPStatus(e.Code)), e.Message, subjects.MarshalError(e))
				return
			}
			_ = req.Respond(encode(res))
		}()
	}
}

// Stop unregisters the service and waits for in-flight requests to get
// their reply. It is idempotent.
func (s *Service) Stop() error {
	s.once.Do(func() {
		s.err = s.svc.Stop()
		for range cap(s.sem) {
			s.sem <- struct{}{}
		}
	})
	return s.err
}
