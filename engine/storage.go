package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/internal/storefull"
)

// probePrefix keys the storage probe's writes in the leases bucket: its
// entries expire with the lease TTL, and the leases read only theirs
// (shard.*, replica.*).
const probePrefix = "probe."

// sizesEvery is how many probes go by between two reads of the buckets'
// sizes: a stream info each, and sizes move slowly.
const sizesEvery = 5

// StorageConfig configures a Storage monitor.
type StorageConfig struct {
	JS jetstream.JetStream
	// Probe is the bucket written to learn whether the store takes
	// writes: chime's leases bucket, unlimited and self-expiring.
	Probe     jetstream.KeyValue
	ReplicaID string
	Topology  Topology
	// Every is the time between probes (default 2 s).
	Every      time.Duration
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// Storage watches whether JetStream's store takes writes, by writing a
// few bytes every interval, and how full chime's limited buckets are. A
// full store refuses every write (so the probe's says it as soon as any
// does); freed, the next probe succeeds and the replica is ready again
// without a restart.
type Storage struct {
	c       StorageConfig
	log     *slog.Logger
	full    prometheus.Gauge
	bytes   *prometheus.GaugeVec
	limit   *prometheus.GaugeVec
	limited map[string]int64 // stream name: max bytes

	mu     sync.Mutex
	reason string // why writes fail for room; "" when they go through

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// NewStorage returns a monitor; Start runs it.
func NewStorage(c StorageConfig) *Storage {
	if c.Every <= 0 {
		c.Every = 2 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	s := &Storage{
		c: c, log: c.Log.With("component", "storage"), done: make(chan struct{}),
		full: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "chime_storage_full", Help: "1 while JetStream's store refuses writes for lack of room, else 0.",
		}),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "chime_storage_bucket_bytes", Help: "Bytes held by each of chime's byte-limited buckets and streams.",
		}, []string{"bucket"}),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "chime_storage_bucket_limit_bytes", Help: "The byte limit of each of chime's byte-limited buckets and streams.",
		}, []string{"bucket"}),
		limited: c.Topology.limitedStreams(),
	}
	if c.Registerer != nil {
		c.Registerer.MustRegister(s.full, s.bytes, s.limit)
	}
	for name, max := range s.limited {
		s.limit.WithLabelValues(name).Set(float64(max))
	}
	return s
}

// Full reports whether writes fail for lack of room, and why.
func (s *Storage) Full() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reason != "", s.reason
}

// Start probes in the background, first at once.
func (s *Storage) Start(ctx context.Context) error {
	ctx, s.cancel = context.WithCancel(ctx)
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.c.Every)
		defer t.Stop()
		for n := 0; ; n++ {
			pctx, cancel := context.WithTimeout(ctx, s.c.Every)
			s.probe(pctx)
			if n%sizesEvery == 0 {
				s.sizes(pctx)
			}
			cancel()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Stop ends the probes. Idempotent and safe without Start.
func (s *Storage) Stop(context.Context) error {
	s.once.Do(func() {
		if s.cancel == nil {
			return
		}
		s.cancel()
		<-s.done
	})
	return nil
}

// probe writes a few bytes: refused for room, the store is full; written,
// it is not. Any other failure (an election, a restart) says nothing
// about room and leaves the state as it was.
func (s *Storage) probe(ctx context.Context) {
	_, err := s.c.Probe.Put(ctx, probePrefix+s.c.ReplicaID, []byte(time.Now().UTC().Format(time.RFC3339)))
	switch {
	case err == nil:
		s.set("")
	case errors.Is(storefull.Of(err), storefull.ErrStorageFull):
		s.set("JetStream refuses writes for lack of room (" + describe(err) + "): free space in the store or raise its limit")
	}
}

func (s *Storage) set(reason string) {
	s.mu.Lock()
	was := s.reason
	s.reason = reason
	s.mu.Unlock()
	switch {
	case was == "" && reason != "":
		s.full.Set(1)
		s.log.Error("storage full: writes refused until space is freed", "reason", reason)
	case was != "" && reason == "":
		s.full.Set(0)
		s.log.Info("storage takes writes again")
	}
}

// sizes reads how full the limited buckets are.
func (s *Storage) sizes(ctx context.Context) {
	for name := range s.limited {
		st, err := s.c.JS.Stream(ctx, name)
		if err != nil {
			continue // missing: the healer's; unreachable: next time
		}
		s.bytes.WithLabelValues(name).Set(float64(st.CachedInfo().State.Bytes))
	}
}

// describe is the engine's own words for a JetStream error, without the
// client's prefixes.
func describe(err error) string {
	if e, ok := errors.AsType[*jetstream.APIError](err); ok {
		return fmt.Sprintf("%s, err_code %d", e.Description, e.ErrorCode)
	}
	return err.Error()
}
