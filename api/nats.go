package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/internal/pacer"
	"github.com/chime-nats/chime/subjects"
)

// ServiceConfig configures the micro service.
type ServiceConfig struct {
	// NC receives the requests and publishes the replies. With NATS
	// authorization it is the responder's connection, which the server
	// lets publish only into inboxes: the actions themselves run on
	// chime's own connection, inside Ops.
	NC      *nats.Conn
	Ops     *Operations
	Version string
	// Confine answers a request only on the inbox of a principal that may
	// have sent it (access.AgentReplyAllowed, access.CallbackReplyAllowed),
	// and refuses, unserved, one whose reply subject is elsewhere. On with
	// NATS authorization; without it every client is trusted and may
	// publish anywhere itself.
	Confine bool
	// Triggers names a callback token's trigger, for Confine.
	Triggers access.CallbackResolver
	Log      *slog.Logger
	// Registerer receives chime_requests_refused_total and
	// chime_replies_failed_total; nil registers none.
	Registerer prometheus.Registerer
	// MaxConcurrent bounds requests in flight on this replica; zero is
	// defaultMaxConcurrent.
	MaxConcurrent int
}

// Service is the micro service every replica registers.
type Service struct {
	cfg ServiceConfig
	ops *Operations
	nc  *nats.Conn
	svc micro.Service
	sem chan struct{}
	// stopping is closed when Stop begins: requests micro still hands
	// over while its subscriptions drain are served if a slot is free and
	// answered unavailable otherwise, never left waiting for a slot that
	// Stop holds.
	stopping chan struct{}
	ctx      context.Context // the requests', from Start
	once     sync.Once
	err      error
	log      *slog.Logger
	refused  *prometheus.CounterVec
	// failed counts replies that could not be sent as built.
	failed *prometheus.CounterVec
	// refusedLog paces the log of refused requests: a flood of them is
	// one line per interval, with the count since the last.
	refusedLog *pacer.Pacer
}

// ServiceDescription is the micro service's description.
const ServiceDescription = "chime: timers, waits, WaitFor, tasks, questions, notifications and callbacks for AI agents over NATS"

// refusedLogInterval is how often refused requests are logged at most.
const refusedLogInterval = 10 * time.Second

// defaultMaxConcurrent bounds requests in flight per replica. micro calls a
// handler serially per subscription, so each request moves to its own
// goroutine, bounded here, to keep storage round trips overlapping.
// Replies go out on the connection, not through micro.Request: micro
// reads the request's error state for its stats once the handler
// returns, which would race with a reply sent later.
const defaultMaxConcurrent = 1024

// flushTimeout bounds the round trip that registers the endpoints.
const flushTimeout = 10 * time.Second

// NewService returns the chime micro service; Start registers it on
// cfg.NC.
func NewService(cfg ServiceConfig) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = defaultMaxConcurrent
	}
	return &Service{
		cfg: cfg, ops: cfg.Ops, nc: cfg.NC, sem: make(chan struct{}, cfg.MaxConcurrent), stopping: make(chan struct{}),
		log: cfg.Log.With("component", "service"), refusedLog: pacer.New(refusedLogInterval),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_requests_refused_total",
			Help: "NATS requests refused unserved, by reason (reply_subject: the reply subject is no inbox of a principal that may send the request).",
		}, []string{"reason"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_replies_failed_total",
			Help: "NATS replies not sent as built, by reason (too_large: over the server's max payload, answered reply_too_large instead; publish: the publish failed, the caller gets no answer).",
		}, []string{"reason"}),
	}
}

// Start registers the service and returns once the server knows its
// endpoints; requests are served under ctx until Stop.
func (s *Service) Start(ctx context.Context) error {
	cfg, nc, ops := s.cfg, s.nc, s.ops
	if cfg.Confine && cfg.Triggers == nil {
		return fmt.Errorf("api: a confined service needs the callback triggers")
	}
	s.ctx = ctx
	svc, err := micro.AddService(nc, micro.Config{
		Name:        subjects.ServiceName,
		Version:     cfg.Version,
		Description: ServiceDescription,
		QueueGroup:  subjects.QueueGroup,
	})
	if err != nil {
		return fmt.Errorf("api: micro service: %w", err)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.refused, s.failed} {
			if err := cfg.Registerer.Register(c); err != nil {
				_ = svc.Stop()
				return fmt.Errorf("api: metrics: %w", err)
			}
		}
	}
	add := func(subject, summary string, h func(micro.Request) *nats.Msg) error {
		name := strings.ReplaceAll(strings.TrimPrefix(subject, "agent.*."), ".", "_")
		if err := svc.AddEndpoint(name, micro.HandlerFunc(s.handler(h)), micro.WithEndpointSubject(subject),
			micro.WithEndpointMetadata(map[string]string{"summary": summary})); err != nil {
			_ = svc.Stop()
			return fmt.Errorf("api: endpoint %s: %w", name, err)
		}
		return nil
	}
	for _, a := range ops.Table().All() {
		if !a.OnNATS() {
			continue
		}
		if err := add(subjects.AgentWildcard(a.Name), a.Summary, func(req micro.Request) *nats.Msg { return s.reply(a.Name, req) }); err != nil {
			return err
		}
	}
	for _, mode := range callbacks.DeliveryModes() {
		subject := subjects.CallbackWake
		if mode == callbacks.ModeEnqueueMessage {
			subject = subjects.CallbackEnqueue
		}
		summary := "a callback: wake the agent (wake_hint)"
		if mode == callbacks.ModeEnqueueMessage {
			summary = "a callback: enqueue the body in the agent's inbox"
		}
		if err := add(subject, summary, func(req micro.Request) *nats.Msg { return s.callback(mode, req) }); err != nil {
			return err
		}
	}
	// The subscriptions are only buffered until flushed; a replica is not
	// serving, and must not say ready, before the server knows them.
	fctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		_ = svc.Stop()
		return fmt.Errorf("api: register endpoints: %w", err)
	}
	// Set once started: a Start that failed has stopped svc itself.
	s.svc = svc
	return nil
}

func (s *Service) handler(h func(micro.Request) *nats.Msg) func(micro.Request) {
	return func(req micro.Request) {
		select {
		case s.sem <- struct{}{}:
		case <-s.stopping:
			s.send(req, answer(req, nil, errStopping))
			return
		}
		go func() {
			defer func() { <-s.sem }()
			s.send(req, s.serve(h, req))
		}()
	}
}

// errStopping answers a request that reached this replica while it stops
// and all its slots are taken: another replica can serve the retry.
var errStopping = &retryError{
	wire:  &subjects.Error{Code: subjects.CodeUnavailable, Message: canceledMessage},
	after: retryAfter,
}

// serve runs h; a panic in it is counted and answered internal rather than
// taking the replica down, as net/http does for a route.
func (s *Service) serve(h func(micro.Request) *nats.Msg, req micro.Request) (m *nats.Msg) {
	defer func() {
		if r := recover(); r != nil {
			s.ops.recovered("nats", req.Subject(), r)
			m = answer(req, nil, errInternal)
		}
	}()
	return h(req)
}

// send publishes a reply. A request without a reply subject is served and
// answered nowhere; a refused one (nil) is not answered. A reply over the
// server's max payload becomes reply_too_large, so that the caller learns
// to ask for less rather than time out.
func (s *Service) send(req micro.Request, m *nats.Msg) {
	if m == nil || m.Subject == "" {
		return
	}
	if max := s.nc.MaxPayload(); max > 0 && int64(len(m.Data)+headerSize(m.Header)) > max {
		s.failed.WithLabelValues("too_large").Inc()
		s.log.Warn("reply over the max payload answered reply_too_large", "subject", req.Subject(), "bytes", len(m.Data), "max_payload", max)
		m = answer(req, nil, subjects.ErrReplyTooLarge(len(m.Data), max))
	}
	if err := s.nc.PublishMsg(m); err != nil {
		s.failed.WithLabelValues("publish").Inc()
		s.log.Warn("reply not sent", "subject", req.Subject(), "err", err)
	}
}

// headerSize is about what m's headers add to its payload.
func headerSize(h nats.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	if n > 0 {
		n += len("NATS/1.0\r\n\r\n")
	}
	return n
}

// reply runs action for the subject's agent.
func (s *Service) reply(action string, req micro.Request) *nats.Msg {
	agentID, err := subjects.ParseAgent(req.Subject())
	if err == nil && !s.replyAllowed(req, func(reply string) bool { return access.AgentReplyAllowed(agentID, reply) }) {
		return nil
	}
	var res any
	if err == nil {
		res, err = s.ops.Do(s.ctx, "nats", action, agentID, req.Data())
	}
	return answer(req, res, err)
}

// callback accepts a callback whose token is in its header.
func (s *Service) callback(mode callbacks.DeliveryMode, req micro.Request) *nats.Msg {
	h := req.Headers()
	token := h.Get(subjects.HeaderCallbackToken)
	if !s.replyAllowed(req, func(reply string) bool {
		var trigger string
		if t, err := s.cfg.Triggers.Resolve(token, mode); err == nil {
			trigger = t.ID
		}
		return access.CallbackReplyAllowed(trigger, reply)
	}) {
		return nil
	}
	res, err := s.ops.Callback(s.ctx, "nats", callbacks.Request{
		Mode: mode, Token: token, ContentType: h.Get(subjects.HeaderContentType),
		IdempotencyKey: h.Get(subjects.HeaderIdempotencyKey), Body: req.Data(),
	})
	return answer(req, res, err)
}

// replyAllowed reports whether req may be served: always without
// confinement or without a reply subject, else when allowed says its reply
// subject is a requester's inbox. A refusal is counted and logged, at most
// once per refusedLogInterval.
func (s *Service) replyAllowed(req micro.Request, allowed func(reply string) bool) bool {
	reply := req.Reply()
	if !s.cfg.Confine || reply == "" || allowed(reply) {
		return true
	}
	s.refused.WithLabelValues("reply_subject").Inc()
	s.refusedLog.Do(1, func(n int64) {
		s.log.Warn("refused requests whose reply subject is no inbox of a principal that may send them",
			"subject", req.Subject(), "reply", reply, "refused", n)
	})
	return false
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
			micro.ErrorCodeHeader: []string{strconv.Itoa(httpStatus(e))},
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

// Stop unregisters the service and waits, within ctx, for in-flight
// requests to get their reply. Requests micro still hands over meanwhile
// are answered unavailable rather than wait for a slot Stop holds
// (handler). It is idempotent and safe without Start.
func (s *Service) Stop(ctx context.Context) error {
	s.once.Do(func() {
		close(s.stopping)
		if s.svc == nil {
			return
		}
		s.err = s.svc.Stop()
		for range cap(s.sem) {
			select {
			case s.sem <- struct{}{}:
			case <-ctx.Done():
				s.err = errors.Join(s.err, fmt.Errorf("api: requests still in flight: %w", ctx.Err()))
				return
			}
		}
	})
	return s.err
}
