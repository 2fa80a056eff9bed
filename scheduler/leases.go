package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Leases keeps this replica's share of the shard leases. A lease is a key
// shard.<n> in a KV bucket whose TTL expires entries: the owner refreshes it
// by CAS every Renew, and a dead owner's keys simply expire, so survivors
// take its shards by creating the keys anew. Replicas announce themselves with
// replica.<id> keys in the same bucket; each aims for an equal share.
type Leases struct {
	kv       jetstream.KeyValue
	id       string
	shards   int
	ttl      time.Duration
	renew    time.Duration
	now      func() time.Time
	log      *slog.Logger
	onChange func()
	healthy  func() (bool, string)

	mu      sync.Mutex
	owned   map[int]lease
	benched string // why this replica stepped back; empty while it serves

	stop    chan struct{}
	done    chan struct{}
	started bool
	once    sync.Once
}

type lease struct {
	rev        uint64
	validUntil time.Time
}

// LeasesConfig configures Leases.
type LeasesConfig struct {
	KV        jetstream.KeyValue // bucket whose TTL is the lease TTL
	ReplicaID string
	Shards    int
	TTL       time.Duration
	Renew     time.Duration // how often leases are refreshed and sought
	Now       func() time.Time
	Log       *slog.Logger
	OnChange  func() // called when the owned set changes
	// Healthy, when set, says whether this replica can fire; while it
	// cannot, it holds no shard and does not count as a replica, so the
	// others take all the shards.
	Healthy func() (bool, string)
}

// NewLeases returns a lease keeper; Start begins its work.
func NewLeases(c LeasesConfig) *Leases {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.OnChange == nil {
		c.OnChange = func() {}
	}
	if c.Healthy == nil {
		c.Healthy = func() (bool, string) { return true, "" }
	}
	return &Leases{
		kv: c.KV, id: c.ReplicaID, shards: c.Shards, ttl: c.TTL, renew: c.Renew,
		now: c.Now, log: c.Log.With("component", "leases"), onChange: c.OnChange, healthy: c.Healthy,
		owned: make(map[int]lease), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// LeaseKey is shard s's lease key in the leases bucket; its value is the
// holding replica's ID.
func LeaseKey(s int) string { return "shard." + strconv.Itoa(s) }

const presencePrefix = "replica."

// Start runs the first round synchronously (so a lone replica owns its
// shards before it reports ready) and then keeps leases in the background.
func (l *Leases) Start(ctx context.Context) error {
	l.mu.Lock()
	l.started = true
	l.mu.Unlock()
	if err := l.round(ctx); err != nil && !errors.Is(err, context.Canceled) {
		l.log.Warn("first lease round", "err", err)
	}
	go l.loop(ctx)
	return nil
}

func (l *Leases) loop(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(l.renew)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.stop:
			return
		case <-t.C:
			if err := l.round(ctx); err != nil && !errors.Is(err, context.Canceled) {
				l.log.Warn("lease round", "err", err)
			}
		}
	}
}

// Stop releases every lease so that survivors take over at once rather than
// after the TTL. It is idempotent, safe without Start, and bounded by ctx
// (a replica that cannot reach NATS leaves its leases to expire).
func (l *Leases) Stop(ctx context.Context) error {
	l.once.Do(func() {
		close(l.stop)
		l.mu.Lock()
		started := l.started
		l.mu.Unlock()
		if started {
			<-l.done
		}
		l.release(ctx, true)
	})
	return nil
}

// release gives back every owned lease, and with presence also this
// replica's presence, so the others divide the shards without it.
func (l *Leases) release(ctx context.Context, presence bool) {
	l.mu.Lock()
	owned := l.owned
	l.owned = map[int]lease{}
	l.mu.Unlock()
	for s, ls := range owned {
		_ = l.kv.Delete(ctx, LeaseKey(s), jetstream.LastRevision(ls.rev))
	}
	if presence {
		_ = l.kv.Delete(ctx, presencePrefix+l.id)
	}
	if len(owned) > 0 {
		l.onChange()
	}
}

// Benched says why this replica holds no shards on purpose; empty while it
// serves.
func (l *Leases) Benched() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.benched
}

// Owned fills owned[s] with whether this replica may fire shard s at now.
func (l *Leases) Owned(now time.Time, owned []bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range owned {
		ls, ok := l.owned[s]
		owned[s] = ok && ls.valid(now)
	}
}

// Leased fills leased[s] with whether this replica holds shard s's lease,
// valid or awaiting its refresh: the shards whose records it keeps.
func (l *Leases) Leased(leased []bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range leased {
		_, leased[s] = l.owned[s]
	}
}

// Count returns how many shards this replica holds.
func (l *Leases) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.owned)
}

// round refreshes presence and owned leases, then gives up or seeks shards
// toward an equal share.
//
// A replica that cannot fire steps back only when another replica can: it
// says so in its presence, and gives its shards to the replicas that do
// not. When none can, the cause is one they share (a stream between
// leaders, a partition that took its quorum): giving every shard away
// would help nobody, and taking them all back once it ends would only
// delay the backlog by a lease round and a reload. So each keeps what it
// holds and fires as soon as it can again.
func (l *Leases) round(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.ttl/2)
	defer cancel()
	ok, why := l.healthy()
	start := l.now()
	me, err := json.Marshal(presenceValue{ID: l.id, Benched: why})
	if err != nil {
		return fmt.Errorf("presence: %w", err)
	}
	if _, err := l.kv.Put(ctx, presencePrefix+l.id, me); err != nil {
		return fmt.Errorf("presence: %w", err) // its leases run out unconfirmed
	}
	// The held leases first, before the listing of the replicas: a slow
	// listing must not spend the round's time and let them lapse.
	lost, regained := l.refresh(ctx, start)
	if regained > 0 {
		l.log.Info("leases confirmed again after they lapsed: firing their shards", "shards", regained)
	}
	// A lease regained is a shard this replica may fire again: the fire
	// loop, which found none to fire, sleeps until told.
	changed := lost || regained > 0
	serving, err := l.serving(ctx)
	if err != nil {
		if changed {
			l.onChange()
		}
		return err
	}
	if !l.bench(ok, why, serving) {
		l.release(ctx, false)
		return nil
	}
	replicas := max(serving, 1)
	target := share(l.shards, replicas)
	if l.rebalance(ctx, start, replicas) {
		changed = true
	}
	if changed {
		l.log.Info("shards", "owned", l.Count(), "target", target, "replicas", replicas)
		l.onChange()
	}
	return nil
}

// bench records whether this replica serves, as round decided, and says
// whether it keeps its shards: while it can fire, or while no other
// replica (of serving) can either.
func (l *Leases) bench(ok bool, why string, serving int) (keep bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	was := l.benched
	switch {
	case ok:
		if was != "" {
			l.log.Info("can fire again: taking shards")
		}
		l.benched = ""
		return true
	case serving > 0:
		if was == "" {
			l.log.Warn("cannot fire: giving shards to the replicas that can", "reason", why, "serving", serving)
		}
		l.benched = why
		return false
	default:
		if was == "" {
			l.log.Warn("cannot fire, nor can any other replica: keeping shards until firing works again", "reason", why)
		}
		// Not benched: it holds shards and fires the moment it can.
		l.benched = ""
		return true
	}
}

// presenceValue is a replica's replica.<id> key.
type presenceValue struct {
	ID string `json:"id"`
	// Benched says why the replica cannot fire; empty while it can.
	Benched string `json:"benched,omitempty"`
}

// refresh confirms every held lease, as of a round begun at start. It
// reports whether one was lost (to another replica, or unconfirmed past
// its validity), and how many had lapsed (held, but past their validity
// at now) and are confirmed again.
func (l *Leases) refresh(ctx context.Context, start time.Time) (lost bool, regained int) {
	l.mu.Lock()
	owned := make(map[int]lease, len(l.owned))
	for s, ls := range l.owned {
		owned[s] = ls
	}
	l.mu.Unlock()
	for s, ls := range owned {
		rev, err := l.kv.Update(ctx, LeaseKey(s), []byte(l.id), ls.rev)
		l.mu.Lock()
		switch {
		case err == nil:
			if !ls.valid(l.now()) {
				regained++
			}
			l.owned[s] = lease{rev: rev, validUntil: validUntil(start, l.ttl, l.renew)}
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists),
			errors.Is(err, jetstream.ErrKeyNotFound), !(lease{validUntil: validUntil(start, l.ttl, l.renew)}).valid(l.now()):
			// Lost to another replica, or unconfirmed past its validity.
			delete(l.owned, s)
			lost = true
		}
		l.mu.Unlock()
	}
	return lost, regained
}

// serving counts the present replicas that can fire, this one included
// when it said so. A presence that does not decode (an earlier version's
// plain ID) serves.
func (l *Leases) serving(ctx context.Context) (int, error) {
	lister, err := l.kv.ListKeysFiltered(ctx, presencePrefix+"*")
	if err != nil {
		return 0, fmt.Errorf("list replicas: %w", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	// The listing also ends, quietly, when ctx does: a part of the
	// presences would count too few replicas, and the target share
	// would be too high.
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("list replicas: %w", err)
	}
	n := 0
	for _, k := range keys {
		e, err := l.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // gone since the listing
		}
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", k, err)
		}
		var p presenceValue
		if json.Unmarshal(e.Value(), &p) == nil && p.Benched != "" {
			continue
		}
		n++
	}
	return n, nil
}

// rebalance gives back the shards beyond this replica's share and seeks
// others up to it, as plan says.
func (l *Leases) rebalance(ctx context.Context, start time.Time, replicas int) bool {
	l.mu.Lock()
	held := make([]int, 0, len(l.owned))
	for s := range l.owned {
		held = append(held, s)
	}
	l.mu.Unlock()
	slices.Sort(held)
	give, seek, want := plan(held, l.shards, replicas, offset(l.id, l.shards))
	changed := false
	for _, s := range give {
		l.mu.Lock()
		ls := l.owned[s]
		delete(l.owned, s)
		l.mu.Unlock()
		_ = l.kv.Delete(ctx, LeaseKey(s), jetstream.LastRevision(ls.rev))
		changed = true
	}
	for _, s := range seek {
		if want == 0 {
			break
		}
		rev, err := l.kv.Create(ctx, LeaseKey(s), []byte(l.id))
		if err != nil {
			continue // held by another replica, or a transient error
		}
		l.mu.Lock()
		l.owned[s] = lease{rev: rev, validUntil: validUntil(start, l.ttl, l.renew)}
		l.mu.Unlock()
		want--
		changed = true
	}
	return changed
}

// validUntil is until when a lease confirmed by a write sent at start may
// be fired on: its TTL less one renew period, so the owner stops before
// its key can expire and be created by another replica.
func validUntil(start time.Time, ttl, renew time.Duration) time.Time { return start.Add(ttl - renew) }

// valid reports whether the lease may be fired on at now.
func (ls lease) valid(now time.Time) bool { return now.Before(ls.validUntil) }

// share is the most shards one of replicas aims to hold: the equal share
// rounded up, so that between them every shard has an owner.
func share(shards, replicas int) int { return (shards + replicas - 1) / replicas }

// plan says what a replica holding held (sorted) of shards, shared among
// replicas, does next: the held shards it gives back, beyond its share;
// the shards it may seek, in the order to try them, starting at offset;
// and how many of those it wants.
func plan(held []int, shards, replicas, offset int) (give, seek []int, want int) {
	target := share(shards, replicas)
	if len(held) > target {
		return held[target:], nil, 0
	}
	if len(held) == target {
		return nil, nil, 0
	}
	for i := range shards {
		if s := (offset + i) % shards; !slices.Contains(held, s) {
			seek = append(seek, s)
		}
	}
	return nil, seek, target - len(held)
}

// offset is where replica id starts seeking shards, so that newcomers do
// not all race for shard 0.
func offset(id string, shards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(shards))
}
