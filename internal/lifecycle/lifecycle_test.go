package lifecycle_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/chime-nats/chime/internal/lifecycle"
)

// journal records starts and stops in the order they happen.
type journal struct {
	mu     sync.Mutex
	events []string
}

func (j *journal) add(e string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, e)
}

func (j *journal) got() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.events)
}

// part is a service that journals; it fails to start with startErr and
// stops after stopFor (or, when block is set, once it is closed), like the
// parts it stands for.
type part struct {
	name     string
	j        *journal
	startErr error
	stopFor  time.Duration
	block    chan struct{}
	stops    int
}

func (p *part) Start(context.Context) error {
	p.j.add("start " + p.name)
	return p.startErr
}

func (p *part) Stop(ctx context.Context) error {
	p.stops++
	p.j.add("stop " + p.name)
	if p.block != nil {
		<-p.block // a stop that ignores ctx
	}
	time.Sleep(p.stopFor)
	return nil
}

func TestGroupStartsInOrderAndStopsInReverse(t *testing.T) {
	j := &journal{}
	var g lifecycle.Group
	a, b, c := &part{name: "a", j: j}, &part{name: "b", j: j}, &part{name: "c", j: j}
	if err := g.Start(t.Context(), a, b); err != nil {
		t.Fatal(err)
	}
	// A later Start adds after the first ones: stopped before them.
	if err := g.Start(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	if err := g.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}
	if got := j.got(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestGroupRollsBackAFailedStart(t *testing.T) {
	j := &journal{}
	var g lifecycle.Group
	boom := errors.New("boom")
	a, b, c := &part{name: "a", j: j}, &part{name: "b", j: j, startErr: boom}, &part{name: "c", j: j}
	if err := g.Start(t.Context(), a, b, c); !errors.Is(err, boom) {
		t.Fatalf("start: %v, want %v", err, boom)
	}
	// The failed one is stopped too (it may have started part way); the
	// one after it never starts.
	want := []string{"start a", "start b", "stop b", "stop a"}
	if got := j.got(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if err := g.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if a.stops != 1 || b.stops != 1 || c.stops != 0 {
		t.Fatalf("stops a=%d b=%d c=%d, want 1 1 0", a.stops, b.stops, c.stops)
	}
}

func TestGroupStopWithoutStartAndTwice(t *testing.T) {
	var g lifecycle.Group
	if err := g.Stop(t.Context()); err != nil {
		t.Fatalf("stop of an unstarted group: %v", err)
	}
	j := &journal{}
	a := &part{name: "a", j: j}
	if err := g.Start(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := g.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if a.stops != 1 {
		t.Fatalf("stopped %d times, want 1", a.stops)
	}
}

func TestGroupStopJoinsErrors(t *testing.T) {
	e1, e2 := errors.New("one"), errors.New("two")
	var g lifecycle.Group
	if err := g.Start(t.Context(),
		lifecycle.Func(nil, func(context.Context) error { return e1 }),
		lifecycle.Func(nil, func(context.Context) error { return e2 }),
	); err != nil {
		t.Fatal(err)
	}
	err := g.Stop(t.Context())
	if !errors.Is(err, e1) || !errors.Is(err, e2) {
		t.Fatalf("stop: %v, want both errors", err)
	}
}

// A stop that never returns holds the group only until ctx's deadline;
// the parts before it in the start order are still stopped.
func TestGroupStopHonoursTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &journal{}
		var g lifecycle.Group
		a, stuck := &part{name: "a", j: j}, &part{name: "stuck", j: j, block: make(chan struct{})}
		defer close(stuck.block)
		if err := g.Start(t.Context(), a, stuck); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		began := time.Now()
		err := g.Stop(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("stop: %v, want the deadline", err)
		}
		if took := time.Since(began); took != 3*time.Second {
			t.Fatalf("stop took %v, want the 3s deadline", took)
		}
		if got, want := j.got(), []string{"start a", "start stuck", "stop stuck", "stop a"}; !slices.Equal(got, want) {
			t.Fatalf("got %q, want %q", got, want)
		}
	})
}

func TestParallelStopsSideBySide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &journal{}
		var g lifecycle.Group
		first := &part{name: "first", j: j}
		drains := []*part{{name: "d1", j: j, stopFor: 5 * time.Second}, {name: "d2", j: j, stopFor: 5 * time.Second}, {name: "d3", j: j, stopFor: 5 * time.Second}}
		last := &part{name: "last", j: j}
		if err := g.Start(t.Context(), first, lifecycle.Parallel(drains[0], drains[1], drains[2]), last); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		if err := g.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
		// Side by side the drains take 5s, not 15s.
		if took := time.Since(began); took != 5*time.Second {
			t.Fatalf("stop took %v, want 5s", took)
		}
		got := j.got()
		want := []string{"start first", "start d1", "start d2", "start d3", "start last", "stop last"}
		if !slices.Equal(got[:6], want) {
			t.Fatalf("got %q, want it to begin %q", got, want)
		}
		drained := got[6:9]
		slices.Sort(drained)
		if !slices.Equal(drained, []string{"stop d1", "stop d2", "stop d3"}) || got[9] != "stop first" {
			t.Fatalf("got %q: the drains, then first", got)
		}
		for _, d := range drains {
			if d.stops != 1 {
				t.Fatalf("%s stopped %d times", d.name, d.stops)
			}
		}
	})
}

func TestParallelRollsBackAFailedStart(t *testing.T) {
	j := &journal{}
	var g lifecycle.Group
	boom := errors.New("boom")
	a, b, c := &part{name: "a", j: j}, &part{name: "b", j: j}, &part{name: "c", j: j, startErr: boom}
	if err := g.Start(t.Context(), a, lifecycle.Parallel(b, c)); !errors.Is(err, boom) {
		t.Fatalf("start: %v, want %v", err, boom)
	}
	want := []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}
	if got := j.got(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestFuncStopsOnce(t *testing.T) {
	n := 0
	f := lifecycle.Func(nil, func(context.Context) error { n++; return nil })
	// Stop without Start, then again.
	_ = f.Stop(t.Context())
	_ = f.Stop(t.Context())
	if n != 1 {
		t.Fatalf("stop ran %d times, want 1", n)
	}
}

// TestLoopRunsUntilStop: Loop's function runs after Start, sees its
// context end at Stop, and Stop returns only once it has returned; Stop
// without Start, and twice, is a no-op.
func TestLoopRunsUntilStop(t *testing.T) {
	if err := lifecycle.Loop(func(context.Context) { t.Error("ran without Start") }).Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	started, returned := make(chan struct{}), make(chan struct{})
	l := lifecycle.Loop(func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		time.Sleep(10 * time.Millisecond) // Stop must wait for this
		close(returned)
	})
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := l.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-returned:
	default:
		t.Fatal("Stop returned before the loop did")
	}
	if err := l.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}
