package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chime-nats/chime/internal/backoff"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrPoison marks an event that can never be applied: it is terminated,
// not redelivered.
var ErrPoison = errors.New("undecodable event")

// ErrNotYet asks for a quiet redelivery: the event waits on another's
// effects, which are on their way.
var ErrNotYet = errors.New("waiting on another event")

// Delivery is one delivery of a stored message to a handler.
type Delivery struct {
	Subject string
	Data    []byte
	// StreamSeq is the message's sequence in its stream: its place in the
	// order events were accepted.
	StreamSeq uint64
	// Delivered counts deliveries of this message, 1 the first time.
	Delivered uint64
	// Attempt counts handler calls for this delivery: 1, then more while
	// the handler answers ErrNotYet and the pool retries it locally.
	Attempt int
	// Last is set on the last delivery (MaxDeliver): a failure is final.
	Last bool
	// Stored is when the stream stored the message (the server's clock).
	Stored time.Time
}

// Handler applies one event's effects; nil acks it, ErrPoison terminates
// it, any other error leaves it for redelivery (terminated instead on its
// last delivery). ErrNotYet is first retried locally, every NakDelay for
// up to WaitFor, the message kept in progress: waiting on another event
// costs no deliveries and escapes BackOff. It must give up when ctx is
// done.
type Handler func(ctx context.Context, d *Delivery) error

// Data adapts a handler of the message body alone.
func Data(h func(ctx context.Context, data []byte) error) Handler {
	return func(ctx context.Context, d *Delivery) error { return h(ctx, d.Data) }
}

// PoolConfig shapes a pool.
type PoolConfig struct {
	Name string // the durable's name, for logs and metrics
	// Create creates (or joins) the durable consumer; the pool calls it at
	// start and again whenever the consumer is found deleted or lost.
	// Build its config with Redelivery.
	Create   func(ctx context.Context) (jetstream.Consumer, error)
	Workers  int           // concurrent handlers
	Timeout  time.Duration // per handler call
	NakDelay time.Duration // before a failed event is redelivered (BackOff adds to it)
	// WaitFor bounds the local retries of an ErrNotYet (default 5 s);
	// then it is naked.
	WaitFor time.Duration
	// DrainTimeout bounds Stop's drain (default 5 s); then in-flight
	// handlers are cancelled.
	DrainTimeout time.Duration
	Fails        prometheus.Counter // the feature's failures; optional
	Metrics      *Metrics           // nil: collectors registered nowhere
}

// Re-creation backoff of a lost consumer.
const (
	recreateMin   = 100 * time.Millisecond
	recreateMax   = 10 * time.Second
	createTimeout = 10 * time.Second
	checkTimeout  = 5 * time.Second

	// A pull lives pullExpiry with heartbeats every pullHeartbeat, so a
	// consumer deleted while no pull of ours was open to hear it is
	// noticed by two missed heartbeats, not by the 30 s default.
	pullExpiry    = 5 * time.Second
	pullHeartbeat = time.Second
)

// Pool runs a durable consumer onto a bounded set of workers, and acks
// each message only after its handler's effects are durable.
//
// It pulls only about two rounds of work ahead. A message pulled is on the
// ack clock; a deep local queue lets a backlog outlive it, the server
// redelivers what is still queued, and the duplicates deepen the queue:
// throughput collapses (measured: waits seconds late). A backlog left on
// the server does not age, and any replica can take it. (A message
// waiting out an ErrNotYet leaves its worker; MaxAckPending bounds those.)
//
// Messages held (queued, in a handler, or waiting to retry an ErrNotYet)
// are kept with m.InProgress() every third of AckWait, so a slow handler
// is never raced by a redelivery of its own message while its replica
// lives.
type Pool struct {
	cfg     PoolConfig
	log     *slog.Logger
	handle  Handler
	metrics *Metrics

	ctx    context.Context // handlers'; cancelled when Stop gives up draining
	cancel context.CancelFunc
	// superCtx bounds re-creation; cancelled as Stop begins.
	superCtx    context.Context
	superCancel context.CancelFunc

	work     chan *held
	check    chan struct{} // a consume error asks whether the consumer still exists
	stopping chan struct{} // Stop has begun
	drained  chan struct{} // no more messages arrive: workers finish the queue and exit
	quit     chan struct{} // Stop is done waiting: nothing waits for a worker any more

	maxDeliver atomic.Int64 // of the current consumer; 0: unbounded
	ackWait    atomic.Int64 // of the current consumer, nanoseconds

	mu sync.Mutex
	cc jetstream.ConsumeContext // the current one

	workers sync.WaitGroup
	super   sync.WaitGroup
	parked  sync.WaitGroup // ErrNotYet messages waiting to be retried
	once    sync.Once
}

// held is a message received and not yet settled.
type held struct {
	m       jetstream.Msg
	at      time.Time  // received
	hb      *heartbeat // from its first handler call to its settling
	waiting time.Time  // since its first ErrNotYet
	attempt int
}

// NewPool returns a pool that consumes onto cfg.Workers workers running
// handle; Start creates its consumer with cfg.Create.
func NewPool(cfg PoolConfig, log *slog.Logger, handle Handler) *Pool {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.WaitFor <= 0 {
		cfg.WaitFor = 5 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 5 * time.Second
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	return &Pool{
		cfg: cfg, log: log, handle: handle, metrics: cfg.Metrics,
		work:     make(chan *held, cfg.Workers),
		check:    make(chan struct{}, 1),
		stopping: make(chan struct{}),
		drained:  make(chan struct{}),
		quit:     make(chan struct{}),
	}
}

// Start creates the consumer and consumes it. A consumer deleted or lost
// later is re-created (capped backoff with jitter) and consumed again.
// ctx bounds the first creation only: the pool runs until Stop.
func (p *Pool) Start(ctx context.Context) error {
	if p.cfg.Create == nil {
		return fmt.Errorf("consumer: %s: no Create", p.cfg.Name)
	}
	p.cfg.Metrics.init(p.cfg.Name)
	cons, err := p.cfg.Create(ctx)
	if err != nil {
		return fmt.Errorf("consumer: %s: create: %w", p.cfg.Name, err)
	}
	p.ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	p.superCtx, p.superCancel = context.WithCancel(context.WithoutCancel(ctx))
	cc, err := p.consume(cons)
	if err != nil {
		p.cancel()
		p.superCancel()
		return err
	}
	for range p.cfg.Workers {
		p.workers.Add(1)
		go p.work1()
	}
	p.super.Add(1)
	go p.supervise(cons, cc)
	return nil
}

// consume starts consuming cons and makes it the current consumer.
func (p *Pool) consume(cons jetstream.Consumer) (jetstream.ConsumeContext, error) {
	if info := cons.CachedInfo(); info != nil {
		p.maxDeliver.Store(int64(max(info.Config.MaxDeliver, 0)))
		p.ackWait.Store(int64(info.Config.AckWait))
	}
	cc, err := cons.Consume(p.receive, jetstream.PullMaxMessages(2*p.cfg.Workers),
		jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if p.superCtx.Err() != nil {
				return
			}
			p.log.Warn("consume", "consumer", p.cfg.Name, "err", err)
			// Missed heartbeats or no responders may mean the consumer is
			// gone without a word; the supervisor asks.
			select {
			case p.check <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		return nil, fmt.Errorf("consumer: %s: consume: %w", p.cfg.Name, err)
	}
	p.mu.Lock()
	p.cc = cc
	p.mu.Unlock()
	return cc, nil
}

// receive hands a message to the workers; it blocks while they are all
// busy, which is what bounds how far ahead the pool pulls.
func (p *Pool) receive(m jetstream.Msg) {
	select {
	case p.work <- &held{m: m, at: time.Now()}:
	case <-p.quit: // left unacked: the server redelivers it
	}
}

// supervise re-creates the consumer whenever its consume ends, or it is
// found gone, while the pool is not stopping.
func (p *Pool) supervise(cons jetstream.Consumer, cc jetstream.ConsumeContext) {
	defer p.super.Done()
	for {
		select {
		case <-p.stopping:
			return
		case <-cc.Closed():
			p.log.Warn("consume ended; re-creating the consumer", "consumer", p.cfg.Name)
		case <-p.check:
			if !p.lost(cons) {
				continue
			}
			p.log.Warn("consumer lost; re-creating it", "consumer", p.cfg.Name)
			cc.Stop()
		}
		var ok bool
		if cons, cc, ok = p.restart(); !ok {
			return
		}
		p.metrics.recreated.WithLabelValues(p.cfg.Name).Inc()
	}
}

// lost reports whether the server no longer knows the consumer.
func (p *Pool) lost(cons jetstream.Consumer) bool {
	ctx, cancel := context.WithTimeout(p.superCtx, checkTimeout)
	defer cancel()
	_, err := cons.Info(ctx)
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// restart creates and consumes the consumer again, retrying with capped,
// jittered backoff; ok is false once the pool is stopping.
func (p *Pool) restart() (jetstream.Consumer, jetstream.ConsumeContext, bool) {
	recreate := backoff.Policy{Min: recreateMin, Max: recreateMax}
	for n := 0; ; n++ {
		ctx, cancel := context.WithTimeout(p.superCtx, createTimeout)
		cons, err := p.cfg.Create(ctx)
		cancel()
		if err == nil {
			var cc jetstream.ConsumeContext
			if cc, err = p.consume(cons); err == nil {
				// Stop waits for this goroutine, then drains p.cc: this one.
				p.log.Info("consumer re-created", "consumer", p.cfg.Name)
				return cons, cc, true
			}
		}
		// Jitter keeps replicas that lost the consumer together from
		// re-creating it in lockstep.
		if p.superCtx.Err() == nil {
			p.log.Warn("re-creating consumer", "consumer", p.cfg.Name, "attempt", n+1, "err", err)
		}
		if !recreate.Sleep(p.superCtx, n) {
			return nil, nil, false // stopping
		}
	}
}

// Stop drains the consumer (in-flight messages finish) and waits for the
// workers, for at most the drain timeout or until ctx ends: then it stops
// consuming and cancels the handlers still running, so it returns in
// bounded time even when the server is unreachable. It is idempotent and
// safe on a nil or never started pool.
func (p *Pool) Stop(ctx context.Context) error {
	if p == nil || p.stopping == nil {
		return nil
	}
	p.once.Do(func() {
		close(p.stopping)
		p.mu.Lock()
		cc := p.cc
		p.mu.Unlock()
		if cc == nil {
			return // never consuming: no worker, no supervisor
		}
		p.superCancel()
		p.super.Wait()

		dctx, cancel := context.WithTimeout(ctx, p.cfg.DrainTimeout)
		defer cancel()
		expired := dctx.Done()
		p.mu.Lock()
		cc = p.cc // the supervisor's last
		p.mu.Unlock()
		cc.Drain()
		select {
		case <-cc.Closed():
		case <-expired:
			p.log.Warn("drain timed out; stopping", "consumer", p.cfg.Name, "after", p.cfg.DrainTimeout)
			cc.Stop()
		}
		close(p.drained)
		done := make(chan struct{})
		go func() { p.workers.Wait(); close(done) }()
		select {
		case <-done:
		case <-expired:
		}
		close(p.quit)
		p.cancel()
		<-done
		p.parked.Wait()
		// What is still queued is handed back for redelivery now.
		for {
			select {
			case h := <-p.work:
				h.release()
			default:
				return
			}
		}
	})
	return nil
}

// work1 is one worker: it settles messages until the pool is drained,
// then finishes what is queued.
func (p *Pool) work1() {
	defer p.workers.Done()
	for {
		select {
		case h := <-p.work:
			p.settle(h)
		case <-p.drained:
			for {
				select {
				case h := <-p.work:
					p.settle(h)
				default:
					return
				}
			}
		}
	}
}

func (p *Pool) settle(h *held) {
	m := h.m
	meta, err := m.Metadata()
	if err != nil { // not a JetStream delivery: nothing to order or retry
		p.terminate(m, &Delivery{Subject: m.Subject()}, ReasonPoison, err)
		return
	}
	h.attempt++
	d := &Delivery{
		Subject: m.Subject(), Data: m.Data(), StreamSeq: meta.Sequence.Stream, Delivered: meta.NumDelivered, Attempt: h.attempt, Stored: meta.Timestamp,
	}
	if md := p.maxDeliver.Load(); md > 0 && int64(meta.NumDelivered) >= md {
		d.Last = true
	}
	if h.hb == nil {
		h.hb = keepAlive(m, h.at, time.Duration(p.ackWait.Load())/3)
	}
	panicked, err := p.run(d)
	if errors.Is(err, ErrNotYet) {
		if h.waiting.IsZero() {
			h.waiting = time.Now()
		}
		if time.Since(h.waiting) < p.cfg.WaitFor && p.park(h) {
			return
		}
	}
	h.hb.stop()
	switch {
	case err == nil:
		_ = m.Ack()
	case errors.Is(err, ErrPoison):
		p.terminate(m, d, ReasonPoison, err)
	case d.Last && panicked:
		p.terminate(m, d, ReasonPanic, err)
	case d.Last:
		p.terminate(m, d, ReasonMaxDeliver, err)
	case errors.Is(err, ErrNotYet):
		_ = m.NakWithDelay(p.cfg.NakDelay)
	default:
		if p.cfg.Fails != nil {
			p.cfg.Fails.Inc()
		}
		if !panicked && !errors.Is(err, context.Canceled) {
			p.log.Warn("event failed; will be redelivered", "consumer", p.cfg.Name, "subject", d.Subject,
				"stream_seq", d.StreamSeq, "delivered", d.Delivered, "err", err)
		}
		_ = m.NakWithDelay(p.cfg.NakDelay)
	}
}

// park queues h again after NakDelay, still in progress; false once the
// pool is stopping.
func (p *Pool) park(h *held) bool {
	select {
	case <-p.stopping:
		return false
	default:
	}
	p.parked.Add(1)
	time.AfterFunc(p.cfg.NakDelay, func() {
		defer p.parked.Done()
		select {
		case p.work <- h:
		case <-p.quit:
			h.release()
		}
	})
	return true
}

// release hands an unsettled message back for redelivery.
func (h *held) release() {
	if h.hb != nil {
		h.hb.stop()
	}
	_ = h.m.Nak()
}

// run calls the handler under the timeout, turning a panic into an error.
func (p *Pool) run(d *Delivery) (panicked bool, err error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Timeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			panicked = true
			err = fmt.Errorf("consumer: %s: handler panic: %v", p.cfg.Name, r)
			p.metrics.panics.WithLabelValues(p.cfg.Name).Inc()
			p.log.Error("handler panicked; recovered", "consumer", p.cfg.Name, "subject", d.Subject,
				"stream_seq", d.StreamSeq, "delivered", d.Delivered, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	return false, p.handle(ctx, d)
}

// terminate gives up on a message for good, and says so.
func (p *Pool) terminate(m jetstream.Msg, d *Delivery, reason string, err error) {
	p.metrics.terminated.WithLabelValues(p.cfg.Name, reason).Inc()
	p.log.Error("event terminated", "consumer", p.cfg.Name, "reason", reason, "subject", d.Subject,
		"stream_seq", d.StreamSeq, "delivered", d.Delivered, "err", err)
	_ = m.TermWithReason(reason)
}

// heartbeat keeps one held message from being redelivered.
type heartbeat struct {
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

// keepAlive sends m.InProgress() every interval, counted from when m was
// received (time queued counts against AckWait too), until stop.
func keepAlive(m jetstream.Msg, received time.Time, every time.Duration) *heartbeat {
	h := &heartbeat{}
	if every <= 0 {
		h.stopped = true
		return h
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.t = time.AfterFunc(max(every-time.Since(received), 0), func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.stopped {
			return
		}
		_ = m.InProgress()
		h.t.Reset(every)
	})
	return h
}

func (h *heartbeat) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	if h.t != nil {
		h.t.Stop()
	}
}
