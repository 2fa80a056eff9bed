package api

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/subjects"
)

// Service is the micro service every replica registers.
type Service struct {
	ops  *Operations
	nc   *nats.Conn
	svc  micro.Service
	sem  chan struct{}
	ctx  context.Context
	once sync.Once
	err  error
}

// maxConcurrent bounds requests in flight per replica. micro calls a
// handler serially per subscription, so each request moves to its own
// goroutine, bounded here, to keep storage round trips overlapping.
// Replies go out on the connection, not through micro.Request: micro
// reads the request's error state for its stats once the handler
// returns, which would race with a reply sent later.
const maxConcurrent = 1024

// flushTimeout bounds the round trip that registers the endpoints.
const flushTimeout = 10 * time.Second

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
	s := &Service{ops: ops, nc: nc, svc: svc, sem: make(chan struct{}, maxConcurrent), ctx: ctx}
	add := func(subject string, h func(micro.Request) *nats.Msg) error {
		name := strings.ReplaceAll(strings.TrimPrefix(subject, "agent.*."), ".", "_")
		if err := svc.AddEndpoint(name, micro.HandlerFunc(s.handler(h)), micro.WithEndpointSubject(subject)); err != nil {
			_ = svc.Stop()
			return fmt.Errorf("api: endpoint %s: %w", name, err)
		}
		return nil
	}
	for _, action := range Actions() {
		if err := add(subjects.AgentWildcard(action), func(req micro.Request) *nats.Msg { return s.reply(action, req) }); err != nil {
			return nil, err
		}
	}
	for _, mode := range subjects.DeliveryModes() {
		subject := subjects.CallbackWake
		if mode == subjects.ModeEnqueueMessage {
			subject = subjects.CallbackEnqueue
		}
		if err := add(subject, func(req micro.Request) *nats.Msg { return s.callback(mode, req) }); err != nil {
			return nil, err
		}
	}
	// The subscriptions are only buffered until flushed; a replica is not
	// serving, and must not say ready, before the server knows them.
	fctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("api: register endpoints: %w", err)
	}
	return s, nil
}

func (s *Service) handler(h func(micro.Request) *nats.Msg) func(micro.Request) {
	return func(req micro.Request) {
		s.sem <- struct{}{}
		go func() {
			defer func() { <-s.sem }()
			_ = s.nc.PublishMsg(h(req))
		}()
	}
}

// reply runs action for the subject's agent.
func (s *Service) reply(action string, req micro.Request) *nats.Msg {
	agentID, err := subjects.ParseAgent(req.Subject())
	var res any
	if err == nil {
		res, err = s.ops.Do(s.ctx, "nats", action, agentID, req.Data())
	}
	return answer(req, res, err)
}

// callback accepts a callback whose token is in its header.
func (s *Service) callback(mode subjects.DeliveryMode, req micro.Request) *nats.Msg {
	h := req.Headers()
	res, err := s.ops.Callback(s.ctx, "nats", callbacks.Request{
		Mode: mode, Token: h.Get(subjects.HeaderCallbackToken), ContentType: h.Get(subjects.HeaderContentType),
		IdempotencyKey: h.Get(subjects.HeaderIdempotencyKey), Body: req.Data(),
	})
	return answer(req, res, err)
}

// answer builds a reply: the result, or the wire error with micro's error
// headers so micro clients see a service error (and, for a storage outage,
// the Retry-After hint HTTP gets).
func answer(req micro.Request, res any, err error) *nats.Msg {
	msg := &nats.Msg{Subject: req.Reply()}
	if err != nil {
		e := subjects.AsError(err)
		msg.Header = nats.Header{
			micro.ErrorHeader:     []string{e.Message},
			micro.ErrorCodeHeader: []string{strconv.Itoa(httpStatus(e.Code))},
		}
		if after, ok := retryAfterSeconds(err); ok {
			msg.Header.Set("Retry-After", after) // the same hint as over HTTP
		}
		msg.Data = subjects.MarshalError(e)
		return msg
	}
	msg.Data = encode(res)
	return msg
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
