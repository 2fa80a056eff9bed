// Package engine owns chime's use of NATS as its engine: the optional
// embedded nats-server, the client connection, and the streams and KV
// buckets chime needs, created idempotently at start.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/liveness"
	"github.com/chime-nats/chime/internal/pacer"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
)

// Names of the streams and buckets chime provisions.
const (
	TimersBucket = "chime_timers"
	WaitsBucket  = "chime_waits"
	AgentsBucket = "chime_agents"
	LeasesBucket = "chime_leases"
	// TriggersBucket holds external triggers, by token hash and by agent.
	TriggersBucket = "chime_triggers"
	// IdempotencyBucket remembers callback Idempotency-Keys for a day.
	IdempotencyBucket = "chime_idempotency"
	// TokensBucket holds agent tokens, as SHA-256: tok.<hash>, agt.<agent>.<token_id>.
	TokensBucket = "chime_tokens"
	EventsStream = "CHIME_EVENTS"
	InboxStream  = "CHIME_INBOX"
	// WaitForBucket holds WaitFor registrations, rec.<agent>.<wait>, and the
	// scope index, idx.<agent>.agent and idx.<agent>.item.<work item>.
	WaitForBucket = "chime_waitfor"
	// WaitForStream holds WaitFor rechecks: JetStream message schedules
	// (waitfor.schedule.<agent>.<wait>) and what they deliver when due
	// (waitfor.recheck.<agent>.<wait>).
	WaitForStream = "CHIME_WAITFOR"
	// HistoryStream holds finished timers and ended waits for the record
	// retention once they have left their bucket (see kvrec.History):
	// history.timer.<agent>.<x>, history.wait.<agent>.<x>, x a hex digit
	// of the record ID's hash.
	HistoryStream = "CHIME_HISTORY"
	// HistoryTimers and HistoryWaits are the kinds' subject prefixes in
	// HistoryStream.
	HistoryTimers = "history.timer"
	HistoryWaits  = "history.wait"
	// QuestionsBucket holds agents' questions to operators, key <agent>.<question>.
	QuestionsBucket = "chime_questions"
	// MCPTasksBucket holds the handles of MCP tasks (the Tasks extension's):
	// which chime record each follows, key live.<agent>.<mcp task> (expiring
	// with the record retention after its last refresh), then, once its end
	// is read, read.<agent>.<mcp task> (an hour).
	MCPTasksBucket = "chime_mcp_tasks"
	// MonitorsBucket holds monitor records, key <agent>.<monitor>.
	MonitorsBucket = "chime_monitors"
	// TasksBucket holds task records, key <agent>.<task>; owner=<task>
	// (which agent holds the ID); <agent>.<task>.<seq> (appended output).
	TasksBucket = "chime_tasks"
	// TaskOutputsBucket is the object store of task outputs over 16 KiB.
	TaskOutputsBucket = "chime_task_outputs"
	// NotificationsBucket holds notifications, key <agent>.<notification>,
	// and each agent's guid, key <agent>. Its revisions are the update
	// sequence UIs follow; the removal markers stay until the notifications
	// package compacts them.
	NotificationsBucket = "chime_notifications"
	// SessionsBucket holds where each agent and callback sender is
	// connected, <agent|callback>.<id>.<server id>.<slot> (a client ID, at
	// most 64 slots a server), so that a
	// revocation can end its connections; kept as long as a session lasts.
	SessionsBucket = "chime_sessions"
	// CountsBucket holds, in the sharded layout, each shard's count of an
	// agent's active timers and waits, key <agent>.<shard>, written by the
	// shard's owner and summed by a create's quota check.
	CountsBucket = "chime_counts"
)

// EmbeddedOptions configures the embedded nats-server.
type EmbeddedOptions struct {
	Listen  string // host:port; port -1 picks a free one
	DataDir string // JetStream store directory
	Name    string // server name; stable across restarts of one data dir
	// MaxStore bounds the JetStream store; 0 is the server's default (75 %
	// of the free disk at start).
	MaxStore int64
	// Auth, when set, turns on authorization: the service user connects
	// with its password, every other client is decided by chime's auth
	// callout (package access).
	Auth *EmbeddedAuth
	// TLS, when set, makes the client listener serve TLS only. chime's own
	// connection is in-process and needs none.
	TLS *EmbeddedTLS
}

// EmbeddedTLS is the embedded server's client TLS: PEM files, read at start.
type EmbeddedTLS struct {
	CertFile, KeyFile string
	// CAFile, when set, makes every client present a certificate that
	// chains to it.
	CAFile string
}

// ServiceUser is the user name of chime's own connections to the embedded
// server.
const ServiceUser = "chime"

// ResponderUser is the user name of the connection that serves requests:
// it may subscribe to the request subjects and publish only the replies
// (EmbeddedAuth.ResponderPermissions), so no request can make it write
// anywhere else.
const ResponderUser = "chime-responder"

// EmbeddedAuth is the embedded server's authorization.
type EmbeddedAuth struct {
	// Password of ServiceUser: made afresh at each start, kept in memory.
	Password string
	// Issuer is the public account nkey that signs admitted users.
	Issuer string
	// ResponderPassword is ResponderUser's, made like Password; empty: no
	// responder user.
	ResponderPassword string
	// ResponderPublish and ResponderSubscribe are the responder's rights.
	ResponderPublish, ResponderSubscribe []string
}

// StartEmbedded runs a JetStream nats-server inside this process and waits
// until it accepts connections.
func StartEmbedded(ctx context.Context, o EmbeddedOptions, log *slog.Logger) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return nil, fmt.Errorf("engine: listen address %q: %w", o.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("engine: listen port %q: %w", portStr, err)
	}
	if o.Name == "" {
		o.Name = "chime"
	}
	opts := &server.Options{
		ServerName: o.Name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   o.DataDir,
		NoSigs:     true,
		// The default 64 MiB pending limit stalls bursts of fires to one subscriber.
		MaxPending:        256 << 20,
		JetStreamMaxStore: o.MaxStore,
	}
	if o.TLS != nil {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: o.TLS.CertFile, KeyFile: o.TLS.KeyFile, CaFile: o.TLS.CAFile, Verify: o.TLS.CAFile != "", Timeout: tlsTimeout,
		})
		if err != nil {
			return nil, fmt.Errorf("engine: embedded server TLS: %w", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify, opts.TLSTimeout = tc, true, o.TLS.CAFile != "", tlsTimeout
	}
	if o.Auth != nil {
		opts.Users = []*server.User{{Username: ServiceUser, Password: o.Auth.Password}}
		authUsers := []string{ServiceUser}
		if o.Auth.ResponderPassword != "" {
			opts.Users = append(opts.Users, &server.User{
				Username: ResponderUser, Password: o.Auth.ResponderPassword,
				Permissions: &server.Permissions{
					Publish:   &server.SubjectPermission{Allow: o.Auth.ResponderPublish},
					Subscribe: &server.SubjectPermission{Allow: o.Auth.ResponderSubscribe},
				},
			})
			authUsers = append(authUsers, ResponderUser)
		}
		opts.AuthCallout = &server.AuthCallout{Issuer: o.Auth.Issuer, AuthUsers: authUsers}
		opts.AuthTimeout = 2 // seconds: a callout answer is one KV read away
	}
	if err := preflight(o.Listen, port, o.DataDir); err != nil {
		return nil, err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("engine: embedded server: %w", err)
	}
	nlog := newNATSLog(log)
	ns.SetLoggerV2(nlog, debug(log), false, false)
	ns.Start()
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	// Ready in steps, so that a start the server gave up on (its store
	// unreadable, say) fails at once with the server's own words.
	for !ns.ReadyForConnections(100 * time.Millisecond) {
		last := nlog.lastError()
		if last != "" || time.Now().After(deadline) || ctx.Err() != nil {
			ns.Shutdown()
			if last == "" {
				last = "no error logged (CHIME_LOG_LEVEL=debug shows its log)"
			}
			return nil, fmt.Errorf("engine: embedded server not ready: %s", last)
		}
	}
	log.Info("embedded nats-server started", "url", ns.ClientURL(), "store_dir", o.DataDir, "tls", o.TLS != nil, "verify_clients", opts.TLSVerify)
	return ns, nil
}

// tlsTimeout is the seconds a client has for its TLS handshake: nats-server's
// default, 2 s, is short for a client far away or a busy CPU.
const tlsTimeout = 5

// Topology is what chime provisions: replicas and retention.
type Topology struct {
	Replicas int
	// Layout is where timer and wait records live: with partitions, each
	// kind has that many buckets and a counts bucket is kept for quotas.
	Layout      partitions.Layout
	LeaseTTL    time.Duration
	InboxMaxAge time.Duration
	EventMaxAge time.Duration
	// DedupWindow is how long a Nats-Msg-Id is remembered. It must cover the
	// longest time a fire can sit between publish and record update.
	DedupWindow time.Duration
	// InboxMaxBytes and EventMaxBytes bound the streams' size, and
	// InboxMaxPerAgent each agent's inbox (messages); zero is no limit.
	InboxMaxBytes, EventMaxBytes int64
	InboxMaxPerAgent             int64
	// TaskOutputMaxAge is how long a stored task output is kept (the
	// record retention); zero keeps them.
	TaskOutputMaxAge time.Duration
	// RecordRetention is how long finished records are kept: the history
	// stream's MaxAge. Zero keeps them.
	RecordRetention time.Duration
	// HistoryMaxBytes bounds the history stream's size; zero is no limit.
	HistoryMaxBytes int64
	// MarkerTTL is how long the record buckets keep the marker of a key
	// removed (expired or purged); zero is DefaultMarkerTTL.
	MarkerTTL time.Duration
	// SessionMaxAge is how long an admitted NATS user lasts, and so its
	// session record; zero is DefaultSessionMaxAge.
	SessionMaxAge time.Duration
	// MaxBytes bounds each bucket and store chime writes on agents'
	// behalf, by bucket name (see LimitVars); missing or zero is no limit.
	// The leases bucket and CHIME_WAITFOR are chime's own, bounded by
	// the shards and the WaitFor records, and stay unlimited.
	MaxBytes map[string]int64
}

// SessionsMaxBytes is the byte limit a replica gives chime_sessions
// (Topology.MaxBytes): each principal keeps at most 64 records per server,
// so no one principal can fill it.
const SessionsMaxBytes = 64 << 20

// DefaultSessionMaxAge is how long an admitted NATS user lasts when the
// topology does not say.
const DefaultSessionMaxAge = time.Hour

// Sessions is the session lifetime: SessionMaxAge, or DefaultSessionMaxAge.
func (t Topology) Sessions() time.Duration {
	if t.SessionMaxAge > 0 {
		return t.SessionMaxAge
	}
	return DefaultSessionMaxAge
}

// LimitVar names the variable that sets a bucket's or stream's byte
// limit: what to lower when the limits do not fit the store, what to
// raise when one is full. Empty for one without a limit.
func LimitVar(name string) string {
	switch name = partitions.Base(name); name {
	case TimersBucket:
		return "CHIME_TIMERS_MAX_BYTES"
	case WaitsBucket:
		return "CHIME_WAITS_MAX_BYTES"
	case TasksBucket:
		return "CHIME_TASKS_MAX_BYTES"
	case TaskOutputsBucket:
		return "CHIME_TASK_OUTPUTS_MAX_BYTES"
	case NotificationsBucket:
		return "CHIME_NOTIFICATIONS_MAX_BYTES"
	case QuestionsBucket:
		return "CHIME_QUESTIONS_MAX_BYTES"
	case MCPTasksBucket:
		return "CHIME_MCP_TASKS_MAX_BYTES"
	case MonitorsBucket:
		return "CHIME_MONITORS_MAX_BYTES"
	case WaitForBucket:
		return "CHIME_WAITFOR_MAX_BYTES"
	case IdempotencyBucket:
		return "CHIME_IDEMPOTENCY_MAX_BYTES"
	case TokensBucket:
		return "CHIME_TOKENS_MAX_BYTES"
	case TriggersBucket:
		return "CHIME_TRIGGERS_MAX_BYTES"
	case AgentsBucket:
		return "CHIME_AGENTS_MAX_BYTES"
	case InboxStream:
		return "CHIME_INBOX_MAX_BYTES"
	case EventsStream:
		return "CHIME_EVENT_MAX_BYTES"
	case HistoryStream:
		return "CHIME_HISTORY_MAX_BYTES"
	}
	return ""
}

// maxBytes is bucket's limit in JetStream's terms (-1: none).
func (t Topology) maxBytes(bucket string) int64 { return noLimit(t.MaxBytes[bucket]) }

// limitedStreams are the streams under chime's byte-limited buckets,
// stores and streams, by stream name: their limits.
func (t Topology) limitedStreams() map[string]int64 {
	out := map[string]int64{}
	for _, c := range buckets(t) {
		if c.MaxBytes > 0 {
			out["KV_"+c.Bucket] = c.MaxBytes
		}
	}
	for _, c := range objectStores(t) {
		if c.MaxBytes > 0 {
			out["OBJ_"+c.Bucket] = c.MaxBytes
		}
	}
	for _, c := range streams(t) {
		if c.MaxBytes > 0 {
			out[c.Name] = c.MaxBytes
		}
	}
	return out
}

// DefaultMarkerTTL is how long a removed record's marker stays: watches
// that are live see it at once; one that resumes later than this after
// an outage misses only removals of records that had already finished,
// which it dropped when they finished. A marker is read by every start,
// so it should not stay much longer than that.
const DefaultMarkerTTL = time.Minute

// Markers is the marker TTL of the record buckets: MarkerTTL, or
// DefaultMarkerTTL.
func (t Topology) Markers() time.Duration {
	if t.MarkerTTL > 0 {
		return t.MarkerTTL
	}
	return DefaultMarkerTTL
}

// noLimit maps chime's "0: no limit" to JetStream's -1.
func noLimit(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// IdempotencyTTL is how long a callback's Idempotency-Key is remembered:
// webhook senders retry for hours, longer than the streams' dedup window.
const IdempotencyTTL = 24 * time.Hour

// Resources are the provisioned handles.
type Resources struct {
	JS jetstream.JetStream
	// Timers and Waits are the record buckets, one per partition.
	Timers, Waits *partitions.Set
	// Counts holds the per-shard active record counts of each agent, in
	// the sharded layout only (nil otherwise).
	Counts   jetstream.KeyValue
	Agents   jetstream.KeyValue
	Leases   jetstream.KeyValue
	Triggers jetstream.KeyValue
	// Idempotency holds callback Idempotency-Keys already stored.
	Idempotency jetstream.KeyValue
	Tokens      jetstream.KeyValue
	WaitFor     jetstream.KeyValue
	Questions   jetstream.KeyValue
	// MCPTasks holds MCP task handles.
	MCPTasks jetstream.KeyValue
	// Monitors holds monitor records.
	Monitors    jetstream.KeyValue
	Tasks       jetstream.KeyValue
	TaskOutputs jetstream.ObjectStore
	// Notifications holds notifications and their update sequence.
	Notifications jetstream.KeyValue
	// Sessions holds where agents and callback senders are connected.
	Sessions jetstream.KeyValue
}

// InternalSubjects are the subjects of chime's streams: what chime
// publishes and consumes itself (inboxes included), which no principal
// may watch (see the monitors' subject source).
func InternalSubjects() []string {
	var out []string
	for _, c := range streams(Topology{}) {
		out = append(out, c.Subjects...)
	}
	return out
}

// buckets are the KV buckets chime keeps, as configured for t. The record
// buckets take per-message TTLs (LimitMarkerTTL: finished records expire,
// see kvrec.Retention); Provision turns that on in buckets made before,
// in place. The server cannot turn it off again, so an older chime no
// longer starts against these buckets.
//
// Every bucket written on agents' behalf has a byte limit (MaxBytes, in
// place on buckets made before) and discards new: at its limit it refuses
// what would grow it and the writer gets bucket_full, while every record
// already stored stays. A key's update that is no larger than what it
// replaces, and a removal, still go through (the server lets a key's new
// message replace its last one then). Discarding old would silently drop
// other agents' records: never that for records. Per bucket, what a full
// one refuses:
//   - timers, waits: creates; and fires whose record grows (a finished one
//     takes a TTL header), which the scheduler retries until there is room:
//     the alert on chime_storage_bucket_bytes comes well before.
//   - tasks, questions, notifications, WaitFor, monitors: the agent's new
//     ones, and growing updates (a task's output, an answer, a monitor's
//     counts).
//   - triggers, tokens, agents: new triggers, tokens, lifecycle changes; an
//     operator's revoke is a removal and goes through.
//   - idempotency: callbacks with a new Idempotency-Key (the sender retries);
//     keys go after a day.
//
// The leases bucket is chime's own, bounded by shards and replicas, and
// has no limit: a renewal must never be refused for an agent's data.
func buckets(t Topology) []jetstream.KeyValueConfig {
	return append(recordBuckets(t), []jetstream.KeyValueConfig{
		{Bucket: QuestionsBucket, Description: "chime questions to operators, key <agent>.<question>", History: 1, Replicas: t.Replicas, LimitMarkerTTL: t.Markers(), MaxBytes: t.maxBytes(QuestionsBucket)},
		{Bucket: MCPTasksBucket, Description: "chime MCP task handles: live.<agent>.<mcp task>, read.<agent>.<mcp task>", History: 1, Replicas: t.Replicas, LimitMarkerTTL: t.Markers(), MaxBytes: t.maxBytes(MCPTasksBucket)},
		{Bucket: MonitorsBucket, Description: "chime monitor records, key <agent>.<monitor>", History: 1, Replicas: t.Replicas, LimitMarkerTTL: t.Markers(), MaxBytes: t.maxBytes(MonitorsBucket)},
		{Bucket: TasksBucket, Description: "chime task records, key <agent>.<task>", History: 1, Replicas: t.Replicas, LimitMarkerTTL: t.Markers(), MaxBytes: t.maxBytes(TasksBucket)},
		// No TTL and no marker TTL: a removal's marker is how a follower
		// behind learns of it, so it stays until compacted on purpose.
		{Bucket: NotificationsBucket, Description: "chime notifications: <agent>.<notification>, <agent> (its guid)", History: 1, Replicas: t.Replicas, MaxBytes: t.maxBytes(NotificationsBucket)},
		{Bucket: AgentsBucket, Description: "chime per-agent state (lifecycle, pause, pending wake), key <agent>", History: 1, Replicas: t.Replicas, MaxBytes: t.maxBytes(AgentsBucket)},
		{
			Bucket: TriggersBucket, Description: "chime external triggers: rec.<agent>.<trigger>, tok.<token sha256>",
			History: 1, Replicas: t.Replicas, LimitMarkerTTL: t.Markers(), MaxBytes: t.maxBytes(TriggersBucket),
		},
		{
			Bucket: TokensBucket, Description: "chime agent tokens: tok.<token sha256>, agt.<agent>.<token id>",
			History: 1, Replicas: t.Replicas, LimitMarkerTTL: t.Markers(), MaxBytes: t.maxBytes(TokensBucket),
		},
		{
			Bucket: WaitForBucket, Description: "chime WaitFor registrations: rec.<agent>.<wait>, idx.<agent>.<scope> (the live one per scope)",
			History: 1, Replicas: t.Replicas, LimitMarkerTTL: t.Markers(), MaxBytes: t.maxBytes(WaitForBucket),
		},
		{
			Bucket: IdempotencyBucket, Description: "callback Idempotency-Keys already stored, key <trigger>.<key sha256>; kept a day",
			History: 1, TTL: IdempotencyTTL, Replicas: t.Replicas, MaxBytes: t.maxBytes(IdempotencyBucket),
		},
		{
			Bucket: SessionsBucket, Description: "chime sessions: <agent|callback>.<id>.<server id>.<slot>, a client ID admitted there, kept as long as a session lasts",
			// Bounded like the agents' buckets: a connect flood fills it, and
			// then connects are admitted unrecorded (their expiry bounds them)
			// rather than refused.
			History: 1, TTL: t.Sessions(), Replicas: t.Replicas, MaxBytes: t.maxBytes(SessionsBucket),
		},
		{
			// File-stored like the rest: a memory bucket is gone after a
			// server restart, and with it every replica's leases.
			Bucket: LeasesBucket, Description: "chime shard leases and replica presence; entries expire after the lease TTL",
			History: 1, TTL: t.LeaseTTL, Replicas: t.Replicas,
		},
	}...)
}

// recordBuckets are the timer and wait buckets, one per partition of the
// layout, and in the sharded layout the counts bucket. A byte limit is
// shared by a kind's partitions: the records spread evenly over them.
func recordBuckets(t Topology) []jetstream.KeyValueConfig {
	l := t.Layout
	keys, counted := "<agent>.<%s>", ""
	if l.Sharded() {
		keys, counted = "<shard>.<agent>.<%s>", fmt.Sprintf(", partition %%d of %d", l.Count())
	}
	var out []jetstream.KeyValueConfig
	for _, kind := range []struct{ base, what, id string }{
		{TimersBucket, "chime timer records", "timer"},
		{WaitsBucket, "chime managed waits", "wait"},
	} {
		limit := t.maxBytes(kind.base)
		if limit > 0 {
			limit = max(limit/int64(l.Count()), 1)
		}
		for p, name := range l.Buckets(kind.base) {
			desc := kind.what + ", key " + fmt.Sprintf(keys, kind.id)
			if counted != "" {
				desc += fmt.Sprintf(counted, p)
			}
			out = append(out, jetstream.KeyValueConfig{
				Bucket: name, Description: desc, History: 1, Replicas: t.Replicas, LimitMarkerTTL: t.Markers(), MaxBytes: limit,
			})
		}
	}
	if l.Sharded() {
		// Unlimited: bounded by shards times agents with records, and a
		// count must never be refused for another agent's data.
		out = append(out, jetstream.KeyValueConfig{
			Bucket: CountsBucket, Description: "chime active timers and waits per agent and shard, key <agent>.<shard>",
			History: 1, Replicas: t.Replicas, LimitMarkerTTL: t.Markers(),
		})
	}
	return out
}

// objectStores are the object stores chime keeps, as configured for t.
func objectStores(t Topology) []jetstream.ObjectStoreConfig {
	return []jetstream.ObjectStoreConfig{{
		Bucket: TaskOutputsBucket, Description: "chime task outputs over 16 KiB, name <agent>/<task>/<result hash>",
		TTL: t.TaskOutputMaxAge, Replicas: t.Replicas, MaxBytes: t.maxBytes(TaskOutputsBucket),
	}}
}

// streams are the streams chime keeps, as configured for t.
func streams(t Topology) []jetstream.StreamConfig {
	return []jetstream.StreamConfig{
		{
			Name:        EventsStream,
			Description: "chime internal events: wait fires, interventions, accepted callbacks, task results to settle",
			Subjects: []string{subjects.TimerFire, subjects.WaitFire, subjects.InterventionApplyAll, subjects.CallbackEventWake, subjects.CallbackEventEnqueue,
				subjects.TaskScheduleAll, subjects.TaskSettleAll},
			// Task settle work items are message schedules (the engine
			// delivers each when its reporter has surely finished).
			AllowMsgSchedules: true,
			AllowRollup:       true,
			Retention:         jetstream.LimitsPolicy,
			MaxAge:            t.EventMaxAge,
			MaxBytes:          noLimit(t.EventMaxBytes),
			// Full, the oldest events go: acked long ago but for an outage
			// as long as the stream. DiscardNew would refuse every wait
			// fire, intervention and callback until MaxAge freed room.
			Discard:    jetstream.DiscardOld,
			Duplicates: t.DedupWindow,
			Replicas:   t.Replicas,
		},
		{
			Name:        InboxStream,
			Description: "agent inboxes: every delivery, kept for offline agents",
			Subjects:    []string{subjects.InboxWildcard},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      t.InboxMaxAge,
			MaxBytes:    noLimit(t.InboxMaxBytes),
			// An agent's inbox, or the stream, full drops the oldest
			// deliveries. DiscardNew would fail the fires into a full inbox
			// forever, and failing fires make a replica give its shards
			// away: one flooded agent would stop everyone's timers.
			MaxMsgsPerSubject: noLimit(t.InboxMaxPerAgent),
			AllowDirect:       true, // inbox.fetch reads an agent's batch in one direct get
			Discard:           jetstream.DiscardOld,
			Duplicates:        t.DedupWindow,
			Replicas:          t.Replicas,
		},
		{
			// The engine delivers each recheck when due: a schedule is the
			// last message on its subject, so a new one replaces it.
			Name:        WaitForStream,
			Description: "chime WaitFor rechecks: message schedules and their deliveries",
			Subjects:    []string{subjects.WaitForScheduleAll, subjects.WaitForRecheckAll},
			Retention:   jetstream.LimitsPolicy,
			// No MaxAge: a schedule may be due in 30 days. A schedule is
			// removed once it fires, and what it delivers carries a TTL.
			AllowMsgTTL:       true,
			Discard:           jetstream.DiscardOld,
			Duplicates:        t.DedupWindow,
			Replicas:          t.Replicas,
			AllowMsgSchedules: true,
			AllowRollup:       true,
		},
		{
			// No per-message TTL and no KV key per record: the server keeps
			// a subject index entry per agent and hash digit, a finished
			// record costs its memory next to nothing, and MaxAge removes
			// records in whole blocks, oldest first.
			Name:        HistoryStream,
			Description: "finished timers and ended waits, kept for the record retention after they left their bucket",
			Subjects:    []string{HistoryTimers + ".>", HistoryWaits + ".>"},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      t.RecordRetention,
			MaxBytes:    noLimit(t.HistoryMaxBytes),
			// Gets and lists read it by direct gets, answered by any replica.
			AllowDirect: true,
			// Full, the oldest finished records go before their retention
			// ends (a get then answers not found): never a live record, and
			// never a refused archive, which would keep the record in its
			// bucket at the memory cost the history is there to save.
			Discard: jetstream.DiscardOld,
			// Nothing is published with a Nats-Msg-Id: a repeat of an archive
			// is read as one (the last one counts). The shortest window the
			// server allows when MaxAge is short.
			Duplicates: historyDuplicates(t.RecordRetention),
			Replicas:   t.Replicas,
		},
	}
}

// historyDuplicates is the history stream's duplicate window: a second,
// within MaxAge (the server refuses a window longer than MaxAge).
func historyDuplicates(maxAge time.Duration) time.Duration {
	if maxAge > 0 && maxAge < time.Second {
		return maxAge
	}
	return time.Second
}

// Provision creates or updates the streams and buckets. It is idempotent, so
// every replica runs it at start.
func Provision(ctx context.Context, js jetstream.JetStream, t Topology) (*Resources, error) {
	kvs := map[string]jetstream.KeyValue{}
	for _, c := range buckets(t) {
		kv, err := createBucket(ctx, js, c)
		if err != nil {
			return nil, err
		}
		kvs[c.Bucket] = kv
	}
	for _, c := range streams(t) {
		if _, err := js.CreateOrUpdateStream(ctx, c); err != nil {
			return nil, fmt.Errorf("engine: %w", streamError(c, err))
		}
	}
	obs := map[string]jetstream.ObjectStore{}
	for _, c := range objectStores(t) {
		o, err := js.CreateOrUpdateObjectStore(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", sizedError("object store", c.Bucket, c.MaxBytes, err))
		}
		obs[c.Bucket] = o
	}
	timers, err := partitionSet(t.Layout, kvs, TimersBucket)
	if err != nil {
		return nil, err
	}
	waits, err := partitionSet(t.Layout, kvs, WaitsBucket)
	if err != nil {
		return nil, err
	}
	return &Resources{
		Tasks: kvs[TasksBucket], TaskOutputs: obs[TaskOutputsBucket], Counts: kvs[CountsBucket],
		JS: js, Timers: timers, Waits: waits, Agents: kvs[AgentsBucket],
		Leases: kvs[LeasesBucket], Triggers: kvs[TriggersBucket], Idempotency: kvs[IdempotencyBucket],
		Tokens: kvs[TokensBucket], WaitFor: kvs[WaitForBucket], Questions: kvs[QuestionsBucket], MCPTasks: kvs[MCPTasksBucket], Monitors: kvs[MonitorsBucket],
		Notifications: kvs[NotificationsBucket], Sessions: kvs[SessionsBucket],
	}, nil
}

// partitionSet is the set of the kind's buckets whose first is base.
func partitionSet(l partitions.Layout, kvs map[string]jetstream.KeyValue, base string) (*partitions.Set, error) {
	var set []jetstream.KeyValue
	for _, name := range l.Buckets(base) {
		set = append(set, kvs[name])
	}
	s, err := partitions.NewSet(l, set)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	return s, nil
}

// storageExceeded is JetStream's "insufficient storage resources
// available": a stream's max bytes are reserved in the server's store
// (75 % of the free disk by default) when the stream is made or grown.
const storageExceeded jetstream.ErrorCode = 10047

// streamError says which stream could not be made, and what to change when
// its size limit does not fit the store.
func streamError(c jetstream.StreamConfig, err error) error {
	return sizedError("stream", c.Name, c.MaxBytes, err)
}

// sizedError is the error of making what (a "stream", "bucket" or "object
// store") name with maxBytes: when its max bytes cannot be reserved, it
// names the variable to lower.
func sizedError(what, name string, maxBytes int64, err error) error {
	if apiErr, ok := errors.AsType[*jetstream.APIError](err); ok && apiErr.ErrorCode == storageExceeded {
		return fmt.Errorf("%s %s: %w: its max bytes (%d) are reserved in the JetStream store, which has less room: "+
			"lower %s or another CHIME_*_MAX_BYTES, or give the store more", what, name, err, maxBytes, LimitVar(name))
	}
	return fmt.Errorf("%s %s: %w", what, name, err)
}

// createBucket creates or updates a bucket. The leases bucket of older
// versions was memory-stored, which a bucket cannot change into: its
// entries are leases that expire in seconds anyway, so it is made anew.
func createBucket(ctx context.Context, js jetstream.JetStream, c jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, c)
	if err != nil && c.Bucket == LeasesBucket {
		if old, serr := js.Stream(ctx, "KV_"+c.Bucket); serr == nil && old.CachedInfo().Config.Storage != c.Storage {
			if err = js.DeleteKeyValue(ctx, c.Bucket); err == nil {
				kv, err = js.CreateOrUpdateKeyValue(ctx, c)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("engine: %w", sizedError("bucket", c.Bucket, c.MaxBytes, err))
	}
	// Updates that end without writing confirm their read on the leader.
	return kvrec.WithLeader(kv, js.Conn()), nil
}

// Heal re-creates every stream and bucket that is missing (deleted by
// hand, or lost with a server's store) and returns their names. Present
// ones are not touched.
func Heal(ctx context.Context, js jetstream.JetStream, t Topology) ([]string, error) {
	var healed []string
	var errs []error
	for _, c := range buckets(t) {
		_, err := js.KeyValue(ctx, c.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			if _, err = createBucket(ctx, js, c); err == nil {
				healed = append(healed, c.Bucket)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("bucket %s: %w", c.Bucket, err))
		}
	}
	for _, c := range streams(t) {
		_, err := js.Stream(ctx, c.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if _, err = js.CreateOrUpdateStream(ctx, c); err == nil {
				healed = append(healed, c.Name)
			}
		}
		if err != nil {
			errs = append(errs, streamError(c, err))
		}
	}
	for _, c := range objectStores(t) {
		_, err := js.ObjectStore(ctx, c.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			if _, err = js.CreateOrUpdateObjectStore(ctx, c); err == nil {
				healed = append(healed, c.Bucket)
			}
		}
		if err != nil {
			errs = append(errs, sizedError("object store", c.Bucket, c.MaxBytes, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return healed, fmt.Errorf("engine: heal: %w", err)
	}
	return healed, nil
}

// ConnectOptions says how to reach NATS.
type ConnectOptions struct {
	URL       string
	CredsFile string
	Token     string
	NkeyFile  string // an nkey seed file (a user of the server config)
	User      string
	Password  string
	Name      string
	Embedded  *server.Server // when set, connect in-process
	// InboxPrefix replaces _INBOX for this connection's reply subjects.
	InboxPrefix string
	// CAFile verifies the server (NATS_URL); CertFile and KeyFile are the
	// client certificate it may require. PEM files; not used in-process.
	CAFile, CertFile, KeyFile string
}

// TLSOptions are the nats.go options of a CA that verifies the server and a
// client certificate, each when set. Any of them makes the connection TLS.
// nats.go reads the files again at every reconnect.
func TLSOptions(caFile, certFile, keyFile string) []nats.Option {
	var opts []nats.Option
	if caFile != "" {
		opts = append(opts, nats.RootCAs(caFile))
	}
	if certFile != "" || keyFile != "" {
		opts = append(opts, nats.ClientCert(certFile, keyFile))
	}
	return opts
}

// Connect opens chime's connection, retrying reconnects forever: a replica
// rides out a NATS restart rather than exiting.
func Connect(o ConnectOptions, log *slog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		// Nothing is held back to be sent after a reconnect: a fire
		// published while disconnected fails at once and its occurrence
		// is retried under a valid lease, by whichever replica holds it
		// then, instead of reaching the stream seconds later from a
		// replica that has lost the shard (a duplicate the stream's
		// window would have to absorb).
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(asyncErrors(log)),
	}
	// A server cut off by the network is given up within seconds, and
	// another server of the cluster tried.
	opts = append(opts, liveness.Options()...)
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.Token != "" {
		opts = append(opts, nats.Token(o.Token))
	}
	if o.NkeyFile != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NkeyFile)
		if err != nil {
			return nil, fmt.Errorf("engine: nkey: %w", err)
		}
		opts = append(opts, opt)
	}
	if o.User != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	url := o.URL
	if o.Embedded != nil {
		opts = append(opts, nats.InProcessServer(o.Embedded))
		// In-process nothing crosses a network, and the server lets such
		// a client skip TLS; a tls:// URL would ask for a handshake.
		url = strings.Replace(o.Embedded.ClientURL(), "tls://", "nats://", 1)
	} else {
		opts = append(opts, TLSOptions(o.CAFile, o.CertFile, o.KeyFile)...)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if o.Embedded != nil {
			return nil, fmt.Errorf("engine: connect to the embedded server: %w", err)
		}
		return nil, connectError(url, err)
	}
	return nc, nil
}

// asyncErrors logs a connection's async errors. Permission violations are
// caused by whoever sends the requests (a reply subject the responder may
// not publish to): a flood of them is one line per interval, with the
// count since the last.
func asyncErrors(log *slog.Logger) nats.ErrHandler {
	violations := pacer.New(10 * time.Second)
	return func(_ *nats.Conn, sub *nats.Subscription, err error) {
		subj := ""
		if sub != nil {
			subj = sub.Subject
		}
		if _, ok := errors.AsType[net.Error](err); ok && sub == nil {
			// A write to the server failed (stalled past liveness.WriteStall, or
			// reset): the connection is given up and another server tried.
			log.Warn("nats write failed: reconnecting", "err", err)
			return
		}
		if !errors.Is(err, nats.ErrPermissionViolation) {
			log.Error("nats async error", "subject", subj, "err", err)
			return
		}
		violations.Do(1, func(n int64) {
			log.Warn("nats permission violations", "subject", subj, "last", err, "violations", n)
		})
	}
}
