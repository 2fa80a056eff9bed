package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/internal/netns"
)

// faultKinds is the kinds done in turn: the kills, or the partitions.
func (r *chaosRun) faultKinds() []string {
	if len(r.o.Partition) > 0 {
		return r.o.Partition
	}
	return r.o.Kill
}

// makeLab makes the run's network lab, closed after every process is
// gone (cleanups run last registered first), with a member per server
// (n1, n2, ...) and per replica (chaos-r1, ...).
func (r *chaosRun) makeLab(ctx context.Context) error {
	if err := netns.Available(ctx); err != nil {
		return fmt.Errorf("bench: --partition needs network namespaces (root and iproute2's ip): %w", err)
	}
	lab, err := netns.New(ctx)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	r.lab = lab
	r.work.Cleanup(lab.Close)
	names := make([]string, 0, r.o.Servers+r.o.Replicas)
	for i := range r.o.Servers {
		names = append(names, fmt.Sprintf("n%d", i+1)) // natsproc.Cluster's server names
	}
	for i := range r.o.Replicas {
		names = append(names, fmt.Sprintf("chaos-r%d", i+1))
	}
	for _, n := range names {
		if _, err := lab.Add(ctx, n); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	r.progress("network lab %s: bridge address %s, a namespace per server and replica", lab.Prefix(), lab.HostAddr())
	return nil
}

// partition cuts one member off for Down, heals it, and on the cluster
// waits until every chime stream is current again, so that two faults
// never take a stream's quorum.
func (r *chaosRun) partition(ctx context.Context, k *killRecord) {
	k.cut = true
	var server *natsproc.Server
	switch k.kind {
	case PartitionInboxLeader, PartitionTimersLeader:
		k.stream = engine.InboxStream
		if k.kind == PartitionTimersLeader {
			k.stream = "KV_" + engine.TimersBucket
		}
		var err error
		if server, err = r.cluster.WaitStreamLeader(ctx, r.js, k.stream); err != nil {
			k.at, k.back, k.skipped = time.Now(), time.Now(), true
			k.fail(err)
			return
		}
	case PartitionNode:
		server = r.nodeToCut(ctx)
	case PartitionReplica:
		p := r.replicas[r.nextReplica%len(r.replicas)]
		r.nextReplica++
		k.target, k.pid = p.id, p.pid()
	}
	if server != nil {
		k.target, k.pid = server.Name(), server.Pid()
	}
	m := r.lab.Member(k.target)
	k.addr = m.Addr.String()
	acksBefore := r.duplicateAcks(ctx)
	k.at = time.Now()
	if err := r.lab.Cut(ctx, k.target); err != nil {
		k.fail(err)
	}
	elected := make(chan election, 1)
	var healed atomic.Bool
	if k.stream != "" {
		go func() { elected <- r.watchElection(ctx, k.stream, server, &healed) }()
	} else {
		elected <- election{}
	}
	backoff.Sleep(ctx, time.Until(k.at.Add(r.o.Down)))
	healed.Store(true)
	// Healed even when ctx ended: Close deletes the lab anyway, but a
	// heal that fails is worth its error.
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.lab.Heal(hctx, k.target); err != nil {
		k.fail(err)
	}
	k.back = time.Now()
	switch e := <-elected; {
	case e.err != nil:
		k.fail(e.err)
	case e.leader != nil:
		k.elected, k.newLeader = e.at, e.leader.Name()
	}
	var errs []error
	for _, st := range chimeStreams {
		errs = append(errs, r.cluster.WaitStreamCurrent(ctx, r.js, st))
	}
	if err := errors.Join(errs...); err != nil {
		k.fail(err)
	}
	k.caughtUp = time.Now()
	k.dupAcks = acksDelta(acksBefore, r.duplicateAcks(ctx))
}

// nodeToCut is a server leading neither CHIME_INBOX nor KV_chime_timers,
// the next in turn; any server, in turn, when each leads one of them or a
// leader is unknown.
func (r *chaosRun) nodeToCut(ctx context.Context) *natsproc.Server {
	var leaders []*natsproc.Server
	for _, st := range []string{engine.InboxStream, "KV_" + engine.TimersBucket} {
		if l, err := r.cluster.StreamLeader(ctx, r.js, st); err == nil {
			leaders = append(leaders, l)
		}
	}
	candidates := slices.DeleteFunc(slices.Clone(r.servers), func(s *natsproc.Server) bool { return slices.Contains(leaders, s) })
	if len(candidates) == 0 {
		candidates = r.servers
	}
	s := candidates[r.nodeTurn%len(candidates)]
	r.nodeTurn++
	return s
}

// operatorTokens writes a tokens file holding the hash of a random token
// nobody is given: a replica in a namespace serves HTTP on its bridge
// address, which chime refuses without operator tokens, and the run uses
// only the open /readyz and /metrics.
func (r *chaosRun) operatorTokens() (string, error) {
	token := make([]byte, 32)
	_, _ = rand.Read(token) // crypto/rand.Read does not fail
	sum := sha256.Sum256([]byte(hex.EncodeToString(token)))
	path := filepath.Join(r.work.dir, "operator-tokens")
	if err := os.WriteFile(path, []byte(hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("bench: operator tokens file: %w", err)
	}
	return path, nil
}

// duplicatesMetric counts a replica's fire publishes the inbox stream
// acknowledged as duplicates: stored before, by an earlier attempt or by
// another replica.
const duplicatesMetric = "chime_fire_duplicates_total"

// duplicateAcks reads duplicatesMetric from each replica's /metrics; a
// replica that does not answer, or a chime without the metric, is left out.
func (r *chaosRun) duplicateAcks(ctx context.Context) map[string]int {
	out := map[string]int{}
	c := http.Client{Timeout: 2 * time.Second}
	for _, p := range r.replicas {
		n, err := scrapeCounter(ctx, &c, "http://"+p.httpAddr+"/metrics", duplicatesMetric)
		if err == nil {
			out[p.id] = n
		}
	}
	return out
}

// scrapeCounter reads an unlabelled counter from a Prometheus text page.
func scrapeCounter(ctx context.Context, c *http.Client, url, name string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	res, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, res.Status)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s: %w", url, name, err)
			}
			return int(f), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", url, err)
	}
	return 0, fmt.Errorf("%s: no %s", url, name)
}

// acksDelta is the sum over the replicas in both of after minus before;
// nil when no replica is in both.
func acksDelta(before, after map[string]int) *int {
	var sum int
	found := false
	for id, a := range after {
		if b, ok := before[id]; ok {
			sum += a - b
			found = true
		}
	}
	if !found {
		return nil
	}
	return &sum
}
