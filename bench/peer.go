package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// PeerResult is what the peer of a timer benchmark measured: JetStream's
// own message schedules (`Nats-Schedule: @at <time>`, nats-server 2.12+) on
// the same server, with the same number of messages and the same due-time
// pattern, measured the same way (due -> arrival at a subscriber).
type PeerResult struct {
	Kind          string  `json:"kind"` // what the peer is
	SchedulesPerS float64 `json:"schedules_per_s"`
	FiresPerS     float64 `json:"fires_per_s"`
	LatenessMs    Latency `json:"lateness_ms"`
	Missed        int     `json:"missed"`
	Duplicates    int     `json:"duplicates"`
}

const (
	peerKind     = "jetstream-msg-schedules-@at"
	peerIDHeader = "Chime-Bench-Id"
)

// peer schedules o.N messages with JetStream message schedules on a scratch
// stream (file storage, AllowMsgSchedules), due as the timers were (o.Lead
// after its own start, spread evenly over o.Spread), and measures when they
// arrive. The server stores a fired schedule's message on its target subject
// without publishing it to core subscribers, so the stream republishes the
// target subject (RePublish, in the store path, the cheapest way out) and the
// bench subscribes to the republished subject as an agent would. The stream
// is deleted at the end.
func peer(ctx context.Context, url string, o TimersOptions, run string) (*PeerResult, error) {
	nc, err := nats.Connect(url, nats.Name("chime-bench peer"))
	if err != nil {
		return nil, fmt.Errorf("bench: peer: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("bench: peer: %w", err)
	}
	prefix := "chimebench.peer." + run
	target, out := prefix+".fired", "chimebench.peerout."+run
	name := "CHIME_BENCH_PEER_" + strings.ToUpper(run)
	// Its own context: the stream goes even when the run is interrupted.
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(cctx, jetstream.StreamConfig{
		Name:              name,
		Subjects:          []string{prefix + ".>"},
		Storage:           jetstream.FileStorage,
		Replicas:          1,
		AllowMsgSchedules: true,
		AllowRollup:       true, // required with schedules
		RePublish:         &jetstream.RePublish{Source: target, Destination: out},
	}); err != nil {
		return nil, fmt.Errorf("bench: peer: create stream: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(dctx, name); err != nil {
			o.Log.Warn("bench: peer: delete stream", "stream", name, "err", err)
		}
	}()

	res := &PeerResult{Kind: peerKind}
	sub, err := nats.Connect(url, nats.Name("chime-bench peer inbox"))
	if err != nil {
		return nil, fmt.Errorf("bench: peer: connect: %w", err)
	}
	defer sub.Close()
	inbox := newArrivals(peerIDHeader, o.N)
	s, err := sub.Subscribe(out, inbox.add)
	if err != nil {
		return nil, fmt.Errorf("bench: peer: subscribe: %w", err)
	}
	s.SetPendingLimits(-1, -1)
	defer func() { _ = s.Unsubscribe() }()
	if err := sub.Flush(); err != nil {
		return nil, fmt.Errorf("bench: peer: flush: %w", err)
	}

	// The same clients as the timers: each publishes its share, one
	// acknowledged publish at a time (as a create is one request at a time).
	conns := make([]jetstream.JetStream, min(o.Clients, 4))
	for i := range conns {
		c, err := nats.Connect(url, nats.Name("chime-bench peer"))
		if err != nil {
			return nil, fmt.Errorf("bench: peer: connect: %w", err)
		}
		defer c.Close()
		if conns[i], err = jetstream.New(c); err != nil {
			return nil, fmt.Errorf("bench: peer: %w", err)
		}
	}
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for c := range o.Clients {
		js := conns[c%len(conns)]
		g.Go(func() error {
			for i := c; i < o.N; i += o.Clients {
				due := start.Add(o.Lead + time.Duration(int64(o.Spread)*int64(i)/int64(o.N)))
				// As a create: never due before it is made (a timer's
				// due time is its creation plus at least 1 ms).
				due = maxTime(due, time.Now().Add(time.Millisecond))
				// The body is the envelope chime would deliver (same size,
				// decoded the same way); FiredAt is not known in advance.
				f := timers.TimerFired{AgentID: run + "-peer", TimerID: "tmr_peer" + strconv.Itoa(i), Occurrence: 1, DueAt: due.UTC(), FiredAt: due.UTC()}
				env := timers.TimerFiredEnvelope(&f)
				body, err := subjects.EncodeJSON(&env)
				if err != nil {
					return fmt.Errorf("bench: peer: %w", err)
				}
				m := nats.NewMsg(prefix + ".s." + strconv.Itoa(i))
				// RFC 3339 with fractions: the server parses them (time.Parse
				// accepts a fraction after the seconds), whereas
				// jetstream.WithScheduleAt truncates to the second.
				m.Header.Set(jetstream.ScheduleHeader, "@at "+due.UTC().Format(time.RFC3339Nano))
				m.Header.Set(jetstream.ScheduleTargetHeader, target)
				m.Header.Set(subjects.HeaderKind, env.Kind)
				m.Header.Set(peerIDHeader, env.ID) // the server strips Nats-Msg-Id from what it fires
				m.Data = body
				if _, err := js.PublishMsg(gctx, m); err != nil {
					return fmt.Errorf("bench: peer: schedule: %w", err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	res.SchedulesPerS = float64(o.N) / time.Since(start).Seconds()
	wait := time.Until(start.Add(o.Lead+o.Spread)) + 10*time.Second
	select {
	case <-inbox.all:
	case <-time.After(wait):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	res.LatenessMs, res.FiresPerS, res.Missed, res.Duplicates = inbox.summary()
	return res, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
