// Package partitions owns where timer and wait records live: the layout
// of their keys and buckets, the record of that layout kept in the store,
// and the map from a record to its bucket and key.
//
// Two layouts exist. The unsharded one (CHIME_PARTITIONS=0, the default
// and what every data directory before it holds) keeps each kind in one
// bucket under <agent>.<id>, and every replica watches all of it. The
// sharded one keeps each kind in P partition buckets (chime_timers,
// chime_timers_1 ... chime_timers_<P-1>) under <shard>.<agent>.<id>, the
// shard in the key: a replica watches only the keys of the shards it
// holds (a subject-filtered watch per shard), so what each replica
// receives and decodes falls as 1/R, and the partitions' stream leaders
// spread the writes over the cluster's nodes. Shard s lives in partition
// s % P, so a shard is always in one bucket.
package partitions

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/subjects"
)

// Layout is where records are kept. Partitions 0 is the unsharded
// layout; Shards is the shard count (CHIME_SHARDS) either way.
type Layout struct {
	Partitions int
	Shards     int
}

// Sharded says the keys carry their shard and the records are spread
// over Partitions buckets.
func (l Layout) Sharded() bool { return l.Partitions > 0 }

// Count is how many buckets each kind has: Partitions, or 1.
func (l Layout) Count() int { return max(l.Partitions, 1) }

// Bucket names partition p of the kind whose first bucket is base:
// base itself for 0, base_<p> after.
func Bucket(base string, p int) string {
	if p == 0 {
		return base
	}
	return base + "_" + strconv.Itoa(p)
}

// Base is the kind's first bucket of a partition bucket's name
// (chime_timers of chime_timers_3); any other name is itself.
func Base(name string) string {
	i := strings.LastIndexByte(name, '_')
	if i < 0 {
		return name
	}
	if n, err := strconv.Atoi(name[i+1:]); err == nil && n > 0 && strconv.Itoa(n) == name[i+1:] {
		return name[:i]
	}
	return name
}

// Buckets are the names of every bucket of the kind whose first is base.
func (l Layout) Buckets(base string) []string {
	out := make([]string, l.Count())
	for p := range out {
		out[p] = Bucket(base, p)
	}
	return out
}

// ShardOf maps a record's logical key (<agent>.<id>) to its shard: the
// replica holding that shard's lease keeps and fires the record. The
// layouts agree on it, so a record keeps its shard across them.
func ShardOf(logical string, shards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(logical))
	return int(h.Sum32() % uint32(shards))
}

// PartitionOf is the partition of shard s.
func (l Layout) PartitionOf(s int) int {
	if !l.Sharded() {
		return 0
	}
	return s % l.Partitions
}

// Place is where the record of agent and id lives: its partition, its
// key in that partition's bucket, and in the sharded layout its shard.
func (l Layout) Place(agentID, id string) (partition int, key string, shard int) {
	logical := subjects.TimerKey(agentID, id)
	if !l.Sharded() {
		return 0, logical, 0 // its shard is only the scheduler's business here
	}
	shard = ShardOf(logical, l.Shards)
	return l.PartitionOf(shard), strconv.Itoa(shard) + "." + logical, shard
}

// ShardKeys is the key filter of shard s's records in its partition
// bucket; only the sharded layout has one.
func ShardKeys(s int) string { return strconv.Itoa(s) + ".>" }

// AgentKeys is the key filter of an agent's records in each bucket.
func (l Layout) AgentKeys(agentID string) string {
	if l.Sharded() {
		return "*." + agentID + ".*"
	}
	return agentID + ".*"
}

// IDKeys is the key filter of every record with the given ID, whoever's.
func (l Layout) IDKeys(id string) string {
	if l.Sharded() {
		return "*.*." + id
	}
	return "*." + id
}

// Parse reads a stored key: the record's logical key (<agent>.<id>),
// its agent's length in it, and its shard. ok is false for any key that
// is not a record of this layout, and for a sharded key whose shard is
// not the one its logical key hashes to: chime did not write it.
func (l Layout) Parse(key string) (logical string, agentLen, shard int, ok bool) {
	logical = key
	if l.Sharded() {
		prefix, rest, found := strings.Cut(key, ".")
		if !found {
			return "", 0, 0, false
		}
		n, err := strconv.Atoi(prefix)
		if err != nil || n < 0 || n >= l.Shards || strconv.Itoa(n) != prefix {
			return "", 0, 0, false
		}
		logical, shard = rest, n
	}
	agentID, _, ok := subjects.ParseRecordKey(logical)
	if !ok {
		return "", 0, 0, false
	}
	switch {
	case l.Sharded() && ShardOf(logical, l.Shards) != shard:
		return "", 0, 0, false
	case !l.Sharded() && l.Shards > 0:
		shard = ShardOf(logical, l.Shards)
	}
	return logical, len(agentID), shard, true
}

// Set is one kind's buckets in a layout, by partition.
type Set struct {
	Layout Layout
	KVs    []jetstream.KeyValue
}

// NewSet returns the set of kvs, one per partition of l in order.
func NewSet(l Layout, kvs []jetstream.KeyValue) (*Set, error) {
	if l.Sharded() && l.Shards < 1 {
		return nil, fmt.Errorf("partitions: %d partitions of %d shards", l.Partitions, l.Shards)
	}
	if len(kvs) != l.Count() {
		return nil, fmt.Errorf("partitions: %d buckets for a layout of %d", len(kvs), l.Count())
	}
	return &Set{Layout: l, KVs: kvs}, nil
}

// Single is the set of one unsharded bucket, as every layout before
// partitions kept.
func Single(kv jetstream.KeyValue, shards int) *Set {
	return &Set{Layout: Layout{Shards: shards}, KVs: []jetstream.KeyValue{kv}}
}

// For is the bucket and key of the record of agent and id.
func (s *Set) For(agentID, id string) (jetstream.KeyValue, string) {
	p, key, _ := s.Layout.Place(agentID, id)
	return s.KVs[p], key
}

// Buckets are the names of the set's buckets, by partition.
func (s *Set) Buckets() []string {
	out := make([]string, len(s.KVs))
	for p, kv := range s.KVs {
		out[p] = kv.Bucket()
	}
	return out
}
