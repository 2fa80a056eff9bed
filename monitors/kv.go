package monitors

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/subjects"
)

// KV source refusals.
const (
	// CodeKVNotAllowed refuses a bucket or key an agent may not watch.
	CodeKVNotAllowed = "monitor_kv_not_allowed"
	// CodeKVBucketNotFound refuses a watch of a bucket that does not exist.
	CodeKVBucketNotFound = "monitor_kv_bucket_not_found"
)

// Bounds of a watched KV source.
const (
	MaxKVBucketLen = 64
	MaxKVKeyLen    = 256
)

// chimePrefix starts the name of every bucket chime keeps (engine's
// chime_*): no monitor may read them, whatever the operator allows, since
// they hold other agents' records and token hashes.
const chimePrefix = "chime"

var (
	kvBucketRe = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	kvTokenRe  = regexp.MustCompile(`^[-/_=a-zA-Z0-9]+$`)
)

// SplitKV cuts a kv source "<bucket>/<key>" at its first "/": a bucket
// name has none, a key may.
func SplitKV(value string) (bucket, key string, ok bool) {
	return strings.Cut(value, "/")
}

// checkKV returns why "<bucket>/<key>" is no watchable KV source for
// anyone, or nil: a valid bucket name that is not chime's, and a key
// pattern of the bucket's keys (tokens of [-/_=A-Za-z0-9], "*" or a last ">").
func checkKV(value string) error {
	bucket, key, ok := SplitKV(value)
	switch {
	case !ok || bucket == "" || key == "":
		return subjects.Invalid(fmt.Sprintf("kv %q must be <bucket>/<key>, the key a NATS-style pattern (builds.> for a prefix)", value))
	case len(bucket) > MaxKVBucketLen:
		return subjects.Invalid(fmt.Sprintf("kv bucket must be at most %d bytes", MaxKVBucketLen))
	case !kvBucketRe.MatchString(bucket):
		return subjects.Invalid(fmt.Sprintf("kv bucket %q is not a valid bucket name (letters, digits, '_' and '-')", bucket))
	case len(key) > MaxKVKeyLen:
		return subjects.Invalid(fmt.Sprintf("kv key must be at most %d bytes", MaxKVKeyLen))
	case strings.HasPrefix(strings.ToLower(bucket), chimePrefix):
		return kvNotAllowed(fmt.Sprintf("bucket %s is chime's own (or named like it): no monitor may watch it", bucket))
	}
	tokens := strings.Split(key, ".")
	for i, t := range tokens {
		if t == "*" || (t == ">" && i == len(tokens)-1) || kvTokenRe.MatchString(t) {
			continue
		}
		return subjects.Invalid(fmt.Sprintf("kv key %q is not a valid key pattern (tokens of letters, digits, '-', '/', '_', '=', or * and a last >)", key))
	}
	return nil
}

func kvNotAllowed(msg string) *subjects.Error {
	return &subjects.Error{Code: CodeKVNotAllowed, Message: msg, Status: 403}
}

// KVPolicy says which KV keys an agent may watch: the operator's patterns
// "<bucket>/<key pattern>" (CHIME_MONITOR_KV), {agent} standing for the
// agent's ID; never chime's buckets. It also starts a monitor at its
// bucket's last revision (Starter), so that it sees every change after its
// start, however late the watch begins. The zero policy allows none.
type KVPolicy struct {
	JS    jetstream.JetStream
	allow []string
}

// NewKVPolicy checks the operator's patterns and returns the policy over
// js. A pattern naming one of chime's buckets, or not a valid
// bucket/key, is an error, so that a mistake fails at start.
func NewKVPolicy(js jetstream.JetStream, allow []string) (KVPolicy, error) {
	p := KVPolicy{JS: js}
	for _, a := range allow {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		// The placeholder is checked as an agent ID would be.
		if err := checkKV(strings.ReplaceAll(a, AgentPlaceholder, "x")); err != nil {
			return KVPolicy{}, fmt.Errorf("monitors: allowed kv %q: %w", a, err)
		}
		p.allow = append(p.allow, a)
	}
	return p, nil
}

// Allowed are the operator's patterns, as given.
func (p KVPolicy) Allowed() []string { return slices.Clone(p.allow) }

// Check returns why agentID may not watch value ("<bucket>/<key>"), or
// nil: the bucket must be one an allowed pattern names and the key lie
// wholly within that pattern's.
func (p KVPolicy) Check(agentID, value string) error {
	if err := checkKV(value); err != nil {
		return err
	}
	if len(p.allow) == 0 {
		return kvNotAllowed("no KV bucket is open to monitors here (CHIME_MONITOR_KV is empty)")
	}
	bucket, key, _ := SplitKV(value)
	for _, a := range p.allow {
		ab, ak, _ := SplitKV(strings.ReplaceAll(a, AgentPlaceholder, agentID))
		if ab == bucket && server.SubjectMatchesFilter(key, ak) {
			return nil
		}
	}
	return kvNotAllowed(fmt.Sprintf("kv %s is not within the keys open to monitors (CHIME_MONITOR_KV: %s)", value, strings.Join(p.allow, ", ")))
}

// Start returns the initial cursor of a monitor of value: its bucket's
// last revision now, so that the watch, begun later on the shard's
// owner, delivers every change made after the start was acknowledged
// and none of the values already there.
func (p KVPolicy) Start(ctx context.Context, _ string, value string) (string, error) {
	bucket, _, _ := SplitKV(value)
	st, err := p.JS.Stream(ctx, kvStream(bucket))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return "", &subjects.Error{Code: CodeKVBucketNotFound, Status: 404, Message: fmt.Sprintf("kv bucket %s does not exist", bucket)}
	}
	if err != nil {
		return "", fmt.Errorf("monitors: kv bucket %s: %w", bucket, err)
	}
	return strconv.FormatUint(st.CachedInfo().State.LastSeq, 10), nil
}

func kvStream(bucket string) string { return "KV_" + bucket }

// KVFeed watches a KV key or pattern with a JetStream KV watch on JS: each
// change is a line "<key> <op> <value>" (op PUT, DEL or PURGE, the value
// one line: its newlines escaped), its cursor the change's revision. It
// sends with Sink.Send, so a watch behind the batches waits and loses
// nothing, and resumes from the record's cursor: a moved monitor sees
// every change after the last one counted, once. The watch is an ordered
// consumer, which recreates itself after a server restart from the last
// revision it passed on.
type KVFeed struct {
	JS jetstream.JetStream
	// GiveUp is how long a watch that cannot be made again is retried
	// before the monitor ends, source_ended (default 2 min).
	GiveUp time.Duration
	// CheckEvery is how often a quiet watch checks that its bucket is
	// still there (default 5 s).
	CheckEvery time.Duration
}

// Run watches m's bucket and key from m's cursor until ctx ends or the
// bucket is gone.
func (f KVFeed) Run(ctx context.Context, m *Monitor, sink *Sink) error {
	bucket, key, ok := SplitKV(m.Source.Value)
	if !ok {
		return &SourceEnded{Why: fmt.Sprintf("kv %q is not <bucket>/<key>", m.Source.Value)}
	}
	var last uint64 // the revision of the last change sent (the record's cursor)
	if m.Cursor != "" {
		n, err := strconv.ParseUint(m.Cursor, 10, 64)
		if err != nil {
			return &SourceEnded{Why: fmt.Sprintf("cursor %q is not a KV revision", m.Cursor)}
		}
		last = n
	}
	giveUp := orDefault(f.GiveUp, 2*time.Minute)
	var failing time.Time // since when no watch could be made; zero: one runs
	for n := 0; ; n++ {
		err := f.follow(ctx, bucket, key, &last, sink)
		var ended *SourceEnded
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &ended):
			return err
		case err == nil: // the watch closed after delivering: made again at once
			failing, n = time.Time{}, 0
			continue
		}
		if failing.IsZero() {
			failing = time.Now()
		}
		if time.Since(failing) >= giveUp {
			return &SourceEnded{Why: fmt.Sprintf("the watch of %s could not be made for %s: %v", m.Source.Value, giveUp, err)}
		}
		if !backoff.Sleep(ctx, min(time.Duration(n+1)*200*time.Millisecond, 5*time.Second)) {
			return nil
		}
	}
}

// errWatchFailed is a watch that could not be made or ended without a
// change: the caller retries.
var errWatchFailed = errors.New("kv watch failed")

// follow runs one watch from *last+1, sending each change and moving
// *last, until ctx ends (nil), the watch closes (nil after a change,
// else an error) or the bucket is gone (*SourceEnded).
func (f KVFeed) follow(ctx context.Context, bucket, key string, last *uint64, sink *Sink) error {
	gone := &SourceEnded{Why: fmt.Sprintf("kv bucket %s was deleted", bucket)}
	kv, err := f.JS.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return gone
	}
	if err != nil {
		return fmt.Errorf("%w: bucket %s: %w", errWatchFailed, bucket, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := kv.Watch(wctx, key, jetstream.IncludeHistory(), jetstream.ResumeFromRevision(*last+1))
	if err != nil {
		return fmt.Errorf("%w: %s/%s: %w", errWatchFailed, bucket, key, err)
	}
	defer stopWatch(w, cancel)
	check := time.NewTicker(orDefault(f.CheckEvery, 5*time.Second))
	defer check.Stop()
	sent := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-check.C:
			// A deleted bucket's ordered consumer may only time out: ask.
			if _, err := f.JS.KeyValue(ctx, bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
				return gone
			}
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				if _, err := f.JS.KeyValue(ctx, bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
					return gone
				}
				if sent {
					return nil
				}
				return fmt.Errorf("%w: the watch of %s/%s closed", errWatchFailed, bucket, key)
			case e == nil: // the end of what was there when the watch began
				continue
			case e.Revision() <= *last:
				// Passed on already (a consumer recreated from earlier):
				// never twice.
				continue
			}
			if err := sink.Send(ctx, Item{Line: kvLine(e), Cursor: strconv.FormatUint(e.Revision(), 10)}); err != nil {
				return nil
			}
			*last, sent = e.Revision(), true
		}
	}
}

// stopWatch ends a watch and drains it: its callback may be blocked
// handing on a change, and would otherwise stay so.
func stopWatch(w jetstream.KeyWatcher, cancel context.CancelFunc) {
	cancel()
	_ = w.Stop()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-t.C:
			return
		}
	}
}

// kvLine is a change as the agent reads it: "<key> <op> <value>", the
// value cut (CapLine cuts the line) and on one line.
func kvLine(e jetstream.KeyValueEntry) string {
	switch e.Operation() {
	case jetstream.KeyValueDelete:
		return e.Key() + " DEL"
	case jetstream.KeyValuePurge:
		return e.Key() + " PURGE"
	}
	v := e.Value()
	v = v[:min(len(v), 2*MaxLineBytes)]
	return e.Key() + " PUT " + strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(string(v))
}
