// Package lifecycle owns the one start/stop shape of chime's long-running
// parts (Service) and the order they run in: a Group starts them in order
// and stops them in reverse, and Parallel stops a few side by side.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Service is a long-running part.
//
// Start returns once the service is ready, or the reason it cannot be;
// ctx bounds that wait. Some services run under ctx, so the context given
// to Start must live until the service is stopped.
//
// Stop ends the service within ctx, draining what it holds first where it
// has to. It is idempotent, a no-op when the service never started, and
// safe after a Start that failed part way.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Group starts services in order and stops the started ones in reverse.
// The zero Group is ready to use.
type Group struct {
	mu      sync.Mutex
	started []Service
}

// Start starts services in order, after any the group started before. On
// a failure it stops, in reverse, every service the group started, the
// failed one too (it may have started part way), and returns the failure.
func (g *Group) Start(ctx context.Context, services ...Service) error {
	for _, s := range services {
		g.mu.Lock()
		g.started = append(g.started, s)
		g.mu.Unlock()
		if err := s.Start(ctx); err != nil {
			// ctx may be what failed: the rollback gets a live one, and
			// each service's own limits bound it.
			return errors.Join(err, g.Stop(context.WithoutCancel(ctx)))
		}
	}
	return nil
}

// Stop stops every started service in reverse order and joins their
// errors. A stop still running when ctx ends is no longer waited for: it
// finishes in the background while the rest are stopped, each with the
// done ctx, which tells it to be quick. Stopping again stops nothing more.
func (g *Group) Stop(ctx context.Context) error {
	started := g.take()
	var errs []error
	for i := len(started) - 1; i >= 0; i-- {
		errs = append(errs, stop(ctx, started[i]))
	}
	return errors.Join(errs...)
}

// take hands over the services started so far, which a stop then owns:
// a second stop finds none.
func (g *Group) take() []Service {
	g.mu.Lock()
	defer g.mu.Unlock()
	started := g.started
	g.started = nil
	return started
}

// stop stops s. Begun before ctx ended, it is waited for until then; begun
// after, it is waited for: it was told to be quick, and what is stopped
// after it may depend on it having stopped.
func stop(ctx context.Context, s Service) error {
	if ctx.Err() != nil {
		return s.Stop(ctx)
	}
	done := make(chan error, 1)
	go func() { done <- s.Stop(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("lifecycle: %T still stopping: %w", s, context.Cause(ctx))
	}
}

// Parallel is one service of services that start in order and stop side
// by side: parts whose stops each wait out a limit (a drain) so that the
// limits do not add up.
func Parallel(services ...Service) Service { return &parallel{services: services} }

type parallel struct {
	services []Service
	g        Group
}

func (p *parallel) Start(ctx context.Context) error { return p.g.Start(ctx, p.services...) }

func (p *parallel) Stop(ctx context.Context) error {
	started := p.g.take()
	errs := make([]error, len(started))
	var wg sync.WaitGroup
	for i, s := range started {
		wg.Go(func() { errs[i] = stop(ctx, s) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Func is a Service of two functions, for glue that needs no type of its
// own; either may be nil. stop runs at most once, whether or not start
// ran, so it must be safe without it.
func Func(start, stop func(ctx context.Context) error) Service {
	return &funcService{start: start, stop: stop}
}

type funcService struct {
	start, stop func(context.Context) error
	once        sync.Once
	err         error
}

func (f *funcService) Start(ctx context.Context) error {
	if f.start == nil {
		return nil
	}
	return f.start(ctx)
}

func (f *funcService) Stop(ctx context.Context) error {
	f.once.Do(func() {
		if f.stop != nil {
			f.err = f.stop(ctx)
		}
	})
	return f.err
}

// Loop is a Service of one goroutine: Start runs run in the background
// under Start's context (a part's context lasts as long as its group
// runs), cancelled by Stop, which waits for run to return. Stop is
// idempotent and safe without Start.
func Loop(run func(ctx context.Context)) Service { return &loop{run: run} }

type loop struct {
	run    func(ctx context.Context)
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

func (l *loop) Start(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cancel != nil {
		return nil
	}
	ctx, l.cancel = context.WithCancel(ctx)
	l.done = make(chan struct{})
	go func() {
		defer close(l.done)
		l.run(ctx)
	}()
	return nil
}

func (l *loop) Stop(ctx context.Context) error {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
