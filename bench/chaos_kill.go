package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/internal/natsproc"
)

// killRecord is one kill as it happened.
type killRecord struct {
	n            int
	kind, target string
	stream       string // leader kills: the stream whose leader was killed
	newLeader    string
	pid          int
	at           time.Time // SIGKILL sent
	elected      time.Time // leader kills on a cluster: another leader seen
	restarted    time.Time // the process started again
	back         time.Time // it answers again: /readyz 200, or a NATS ping
	caughtUp     time.Time // cluster: every chime stream has its replicas current
	errs         []string
	skipped      bool // no target was found: nothing was killed
	// Partitions: cut is set, at is the cut and back the heal; addr is
	// the target's address in its namespace.
	cut  bool
	addr string
	// dupAcks: the replicas' duplicate publish acks from just before the
	// cut until the streams were current again; nil when unknown.
	dupAcks *int
}

func (k *killRecord) fail(err error) { k.errs = append(k.errs, err.Error()) }

// outageEnd is when the target answered again or, if later, another
// leader was elected.
func (k *killRecord) outageEnd() time.Time {
	if k.elected.After(k.back) {
		return k.elected
	}
	return k.back
}

// chimeStreams are the streams a restarted server must have caught up on
// before the next kill, so that two kills never take a stream's quorum.
var chimeStreams = []string{
	engine.InboxStream, engine.EventsStream,
	"KV_" + engine.TimersBucket, "KV_" + engine.WaitsBucket, "KV_" + engine.LeasesBucket,
}

// killer does a kill every Every, of the kinds in turn, until loadCtx ends;
// a kill in progress (its restart) finishes on ctx. A kill that outlasts
// Every is followed by the next one at once.
func (r *chaosRun) killer(loadCtx, ctx context.Context) {
	kinds := r.faultKinds()
	if len(kinds) == 0 {
		return
	}
	next := r.start.Add(r.o.Every)
	for i := 0; ; i++ {
		if !backoff.Sleep(loadCtx, time.Until(next)) {
			return
		}
		k := &killRecord{n: i + 1, kind: kinds[i%len(kinds)]}
		switch {
		case len(r.o.Partition) > 0:
			r.partition(ctx, k)
		case k.kind == KillReplica:
			r.killReplica(ctx, k)
		case k.kind == KillServer:
			s := r.servers[rand.IntN(len(r.servers))]
			r.killServer(ctx, k, s)
		case k.kind == KillLeader:
			r.killLeader(ctx, k)
		}
		r.mu.Lock()
		r.kills = append(r.kills, k)
		r.mu.Unlock()
		r.progress("%s", r.killLine(k))
		next = k.at.Add(r.o.Every)
		if ctx.Err() != nil {
			return
		}
	}
}

func (r *chaosRun) killReplica(ctx context.Context, k *killRecord) {
	p := r.replicas[r.nextReplica%len(r.replicas)]
	r.nextReplica++
	k.target, k.pid = p.id, p.pid()
	k.at = time.Now()
	if err := p.kill(); err != nil {
		k.fail(err)
	}
	backoff.Sleep(ctx, time.Until(k.at.Add(r.o.Down)))
	k.restarted = time.Now()
	if err := p.start(); err != nil {
		k.fail(err)
	} else if err := p.waitReady(ctx, replicaReady); err != nil {
		k.fail(err)
	}
	k.back = time.Now()
}

func (r *chaosRun) killLeader(ctx context.Context, k *killRecord) {
	k.stream = []string{engine.InboxStream, "KV_" + engine.TimersBucket}[r.leaderTurn%2]
	r.leaderTurn++
	if r.cluster == nil {
		r.killServer(ctx, k, r.servers[0]) // a standalone server leads everything
		return
	}
	leader, err := r.cluster.WaitStreamLeader(ctx, r.js, k.stream)
	if err != nil {
		k.at, k.back, k.skipped = time.Now(), time.Now(), true
		k.fail(err)
		return
	}
	r.killServer(ctx, k, leader)
}

// killServer SIGKILLs s, restarts it on its store after Down and, on a
// cluster, waits until it has caught up.
func (r *chaosRun) killServer(ctx context.Context, k *killRecord, s *natsproc.Server) {
	k.target, k.pid = s.Name(), s.Pid()
	k.at = time.Now()
	if err := s.Kill(); err != nil {
		k.fail(err)
	}
	// The election is watched while the server is down, not waited for:
	// the server comes back after Down however long the election takes,
	// and may win it itself.
	elected := make(chan election, 1)
	var restarted atomic.Bool
	if k.stream != "" && r.cluster != nil {
		go func() { elected <- r.watchElection(ctx, k.stream, s, &restarted) }()
	} else {
		elected <- election{}
	}
	backoff.Sleep(ctx, time.Until(k.at.Add(r.o.Down)))
	restarted.Store(true)
	k.restarted = time.Now()
	if err := s.Start(); err != nil {
		k.fail(err)
	}
	k.back = time.Now()
	switch e := <-elected; {
	case e.err != nil:
		k.fail(e.err)
	case e.leader != nil:
		k.elected, k.newLeader = e.at, e.leader.Name()
	}
	if r.cluster == nil {
		return
	}
	for _, st := range chimeStreams {
		if err := r.cluster.WaitStreamCurrent(ctx, r.js, st); err != nil {
			k.fail(err)
		}
	}
	k.caughtUp = time.Now()
}

// election is the first leader a stream had after its leader was killed.
type election struct {
	at     time.Time
	leader *natsproc.Server
	err    error
}

// electionTimeout bounds the watch of an election: a Raft election takes
// seconds, not this.
const electionTimeout = 30 * time.Second

// watchElection polls the stream's leader until it is another server than
// killed, or any once killed is restarting.
func (r *chaosRun) watchElection(ctx context.Context, stream string, killed *natsproc.Server, restarted *atomic.Bool) election {
	ctx, cancel := context.WithTimeout(ctx, electionTimeout)
	defer cancel()
	var last error
	for {
		l, err := r.cluster.StreamLeader(ctx, r.js, stream)
		switch {
		case err != nil:
			last = err
		case l != killed || restarted.Load():
			return election{at: time.Now(), leader: l}
		default:
			last = fmt.Errorf("leader is still %s", l.Name())
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return election{err: fmt.Errorf("stream %s: no leader within %v of the kill (last: %v)", stream, electionTimeout, last)}
		}
	}
}

func (r *chaosRun) killLine(k *killRecord) string {
	var b strings.Builder
	what, back := "kill", "back %v after the kill"
	if k.cut {
		what, back = "partition", "healed %v after the cut"
	}
	fmt.Fprintf(&b, "%s %d at %.1fs: %s ", what, k.n, r.since(k.at), k.kind)
	if k.stream != "" {
		fmt.Fprintf(&b, "of %s ", k.stream)
	}
	fmt.Fprintf(&b, "%s (pid %d", k.target, k.pid)
	if k.addr != "" {
		fmt.Fprintf(&b, ", %s", k.addr)
	}
	b.WriteString(")")
	if k.skipped {
		fmt.Fprintf(&b, ": skipped")
	} else {
		if !k.elected.IsZero() {
			fmt.Fprintf(&b, ", new leader %s after %v", k.newLeader, ms3(k.elected.Sub(k.at)))
		}
		fmt.Fprintf(&b, ", "+back, ms3(k.back.Sub(k.at)))
		if !k.caughtUp.IsZero() {
			fmt.Fprintf(&b, ", streams current after %v", ms3(k.caughtUp.Sub(k.at)))
		}
	}
	for _, e := range k.errs {
		fmt.Fprintf(&b, "\n  error: %s", e)
	}
	return b.String()
}

func ms3(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
