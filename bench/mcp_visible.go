package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/subjects"
)

// seen is one short wait's end as a client saw it.
type seen struct {
	late  time.Duration  // the end in the client's hands minus the target
	fire  *time.Duration // the record's end minus the target, when the client sees it
	calls int            // polls (tasks/get, inbox.fetch) it took
}

// way is one way of seeing a short wait's end: one waits one wait as its
// agent c and says when the end reached it.
type way struct {
	name, how string
	one       func(ctx context.Context, c int) (seen, error)
}

// visible runs o.Visible short waits per way, every way at once, and adds
// what each saw to res.
func visible(ctx context.Context, f *mcpFleet, o MCPOptions, res *MCPResult) error {
	res.WaitSeconds, res.PollMs = o.WaitSeconds, o.Poll.Milliseconds()
	wait := time.Duration(o.WaitSeconds) * time.Second
	bound := wait + 20*time.Second
	var intervals sync.Map // the server's suggested poll intervals, in ms

	fast, err := f.mcpAgents(ctx, "vf", o.VisibleClients, true)
	if err != nil {
		return err
	}
	suggested, err := f.mcpAgents(ctx, "vs", o.VisibleClients, true)
	if err != nil {
		return err
	}
	blocking, err := f.mcpAgents(ctx, "vb", o.VisibleClients, false)
	if err != nil {
		return err
	}
	push, err := f.natsAgents(ctx, "vp", o.VisibleClients)
	if err != nil {
		return err
	}
	fetch, err := f.natsAgents(ctx, "vi", o.VisibleClients)
	if err != nil {
		return err
	}

	// poll follows a task to completed with tasks/get: the first poll at a
	// random phase within the interval (clients are not in step with the
	// target), then one every interval (fixed, or the server's latest).
	poll := func(ctx context.Context, a *mcpAgent, fixed time.Duration) (seen, error) {
		t, err := a.callTask(ctx, map[string]any{"seconds": o.WaitSeconds})
		if err != nil {
			return seen{}, err
		}
		interval := fixed
		if fixed == 0 {
			interval = time.Duration(t.PollIntervalMs) * time.Millisecond
			intervals.Store(t.PollIntervalMs, true)
		}
		if interval <= 0 {
			return seen{}, fmt.Errorf("task %s: no pollIntervalMs", t.TaskID)
		}
		at := time.Now().Add(rand.N(interval))
		var s seen
		for {
			if !sleepUntil(ctx, at) {
				return seen{}, ctx.Err()
			}
			sent := at
			got, err := a.get(ctx, t.TaskID)
			if err != nil {
				return seen{}, err
			}
			s.calls++
			if got.Status == "completed" {
				now := time.Now()
				due, err := targetOf(got.Result)
				if err != nil {
					return seen{}, fmt.Errorf("task %s: %w", t.TaskID, err)
				}
				s.late = now.Sub(due)
				if ended, err := time.Parse(time.RFC3339Nano, got.LastUpdatedAt); err == nil {
					s.fire = new(ended.Sub(due))
				}
				return s, nil
			}
			if got.Status != "working" {
				return seen{}, fmt.Errorf("task %s is %s: %s", t.TaskID, got.Status, got.StatusMessage)
			}
			// The next poll is an interval after this one, the interval
			// being the one this reply suggests (a client honours the latest).
			if fixed == 0 && got.PollIntervalMs > 0 {
				interval = time.Duration(got.PollIntervalMs) * time.Millisecond
				intervals.Store(got.PollIntervalMs, true)
				at = time.Now().Add(interval)
			} else {
				at = sent.Add(interval)
			}
			if at.Before(time.Now()) {
				at = time.Now() // a slow reply: poll again at once, not in a burst
			}
		}
	}

	// The push agents' inboxes, subscribed once: each wait_complete with
	// the time it arrived.
	type arrival struct {
		waitID string
		due    time.Time
		at     time.Time
	}
	pushed := make([]chan arrival, len(push))
	for c, a := range push {
		ch := make(chan arrival, 64)
		pushed[c] = ch
		sub, err := a.nc.Subscribe(subjects.Inbox(a.id), func(m *nats.Msg) {
			at := time.Now()
			if id, due, ok := waitCompleteOf(m.Data); ok {
				select {
				case ch <- arrival{id, due, at}:
				default:
				}
			}
		})
		if err != nil {
			return fmt.Errorf("bench: subscribe: %w", err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := a.nc.Flush(); err != nil {
			return fmt.Errorf("bench: flush: %w", err)
		}
	}

	ways := []way{
		{fmt.Sprintf("mcp poll %s", o.Poll), fmt.Sprintf("Tasks extension: tools/call, then tasks/get every %s (the first at a random point of the first interval)", o.Poll),
			func(ctx context.Context, c int) (seen, error) { return poll(ctx, fast[c], o.Poll) }},
		{"mcp poll suggested", "Tasks extension: tools/call, then tasks/get at the task's pollIntervalMs (the first at a random point of the first interval)",
			func(ctx context.Context, c int) (seen, error) { return poll(ctx, suggested[c], 0) }},
		{"mcp blocking call", "no extension: tools/call wait blocks until the end",
			func(ctx context.Context, c int) (seen, error) {
				a := blocking[c]
				res, err := a.cs.CallTool(ctx, &sdk.CallToolParams{Name: "wait", Arguments: map[string]any{"seconds": o.WaitSeconds}})
				now := time.Now()
				if err != nil {
					return seen{}, err
				}
				if res.IsError {
					return seen{}, errors.New(toolText(res))
				}
				due, err := targetOf(res)
				if err != nil {
					return seen{}, err
				}
				return seen{late: now.Sub(due)}, nil
			}},
		{"nats inbox subscribe", "NATS: wait.request, the wait_complete on agent.<id>.inbox (core subscription)",
			func(ctx context.Context, c int) (seen, error) {
				reply, err := push[c].request(ctx, o.WaitSeconds)
				if err != nil {
					return seen{}, err
				}
				for {
					select {
					case a := <-pushed[c]:
						if a.waitID == reply.WaitID {
							return seen{late: a.at.Sub(a.due)}, nil
						}
					case <-ctx.Done():
						return seen{}, fmt.Errorf("wait %s: no wait_complete: %w", reply.WaitID, ctx.Err())
					}
				}
			}},
		{"nats inbox.fetch", "NATS: wait.request, then inbox.fetch {wait_ms: 5000} until the wait_complete, and inbox.ack",
			func(ctx context.Context, c int) (seen, error) {
				a := fetch[c]
				reply, err := a.request(ctx, o.WaitSeconds)
				if err != nil {
					return seen{}, err
				}
				var s seen
				for {
					got, err := a.c.FetchInbox(ctx, 16, 5*time.Second)
					if err != nil {
						return seen{}, err
					}
					now := time.Now()
					s.calls++
					found := false
					for _, d := range got.Deliveries {
						if id, due, ok := waitCompleteOf(d.Envelope); ok && id == reply.WaitID {
							s.late, found = now.Sub(due), true
						}
					}
					if n := len(got.Deliveries); n > 0 {
						if _, err := a.c.AckInbox(ctx, got.Deliveries[n-1].Seq); err != nil {
							return seen{}, err
						}
					}
					if found {
						return s, nil
					}
				}
			}},
	}

	out := make([]MCPVisible, len(ways))
	var g errgroup.Group
	for w, wy := range ways {
		out[w] = MCPVisible{Way: wy.name, How: wy.how, N: o.Visible}
		var mu sync.Mutex
		var late, fire []time.Duration
		calls := 0
		var wg sync.WaitGroup
		for c := range o.VisibleClients {
			wg.Go(func() {
				// Agents start apart, so their targets are spread.
				if !sleepUntil(ctx, time.Now().Add(rand.N(wait))) {
					return
				}
				for i := c; i < o.Visible; i += o.VisibleClients {
					wctx, cancel := context.WithTimeout(ctx, bound)
					s, err := wy.one(wctx, c)
					cancel()
					mu.Lock()
					if err != nil {
						out[w].Missed++
						if out[w].FirstErr == "" {
							out[w].FirstErr = err.Error()
						}
					} else {
						late = append(late, s.late)
						if s.fire != nil {
							fire = append(fire, *s.fire)
						}
						calls += s.calls
					}
					mu.Unlock()
					if ctx.Err() != nil {
						return
					}
				}
			})
		}
		g.Go(func() error {
			wg.Wait()
			out[w].LatenessMs = summarize(late)
			if len(fire) > 0 {
				out[w].FireMs = new(summarize(fire))
			}
			if n := len(late); n > 0 && calls > 0 {
				out[w].CallsPerWait = float64(calls) / float64(n)
			}
			return nil
		})
	}
	_ = g.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	res.Visible = out
	intervals.Range(func(k, _ any) bool {
		res.ServerPollMs = append(res.ServerPollMs, k.(int64))
		return true
	})
	slices.Sort(res.ServerPollMs)
	return nil
}

// sleepUntil sleeps until at or ctx's end, and says whether at came.
func sleepUntil(ctx context.Context, at time.Time) bool {
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
