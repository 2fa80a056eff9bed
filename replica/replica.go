// Package replica owns the life of one chime replica: it starts the
// components in dependency order (NATS, provisioning, consumer, scheduler,
// leases, NATS service, HTTP) and stops them in reverse, draining first.
package replica

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/api"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/console"
	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/fleet"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/lifecycle"
	"github.com/chime-nats/chime/internal/secret"
	"github.com/chime-nats/chime/mcp"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/scheduler"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waitfor"
	"github.com/chime-nats/chime/waits"
)

// Replica is one running chime.
type Replica struct {
	cfg *config.Config
	log *slog.Logger
	ns  *server.Server
	nc  *nats.Conn
	// responder serves the requests: with NATS authorization a connection
	// that may publish only into inboxes, else nc.
	responder *nats.Conn
	// system is chime's system account connection to an external cluster
	// (the kick service); nil otherwise.
	system *nats.Conn
	// storage and sched answer Readiness; gw, HTTPAddr.
	storage *engine.Storage
	sched   *scheduler.Scheduler
	gw      *api.Gateway
	// parts are the long-running parts, in their start order (see Start).
	parts   lifecycle.Group
	ready   atomic.Bool
	cancel  context.CancelCauseFunc
	once    sync.Once
	Version string
}

// Start brings a replica up. On error everything started is stopped.
func Start(ctx context.Context, cfg *config.Config, log *slog.Logger, version string) (_ *Replica, err error) {
	r := &Replica{cfg: cfg, log: log, Version: version}
	defer func() {
		if err != nil {
			r.Stop(context.Background())
		}
	}()
	// ctx bounds the start; the replica then lives until Stop.
	startCtx := ctx
	ctx, r.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	issuer, err := calloutIssuer(cfg)
	if err != nil {
		return nil, err
	}
	url := cfg.NATSURL
	// chime's own replies come back under a prefix no principal may read
	// or be answered into.
	conn := engine.ConnectOptions{
		URL: url, CredsFile: cfg.NATSCreds, Token: cfg.NATSToken, NkeyFile: cfg.NATSNkeyFile,
		Name: "chime " + cfg.ReplicaID, InboxPrefix: access.ServiceInboxPrefix,
		CAFile: cfg.NATSTLSCA, CertFile: cfg.NATSTLSClientCert, KeyFile: cfg.NATSTLSClientKey,
	}
	responder := conn
	responder.Name, responder.NkeyFile = "chime responder "+cfg.ReplicaID, cfg.NATSResponderNkeyFile
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}
	// The parts start in this order and stop in reverse, which is why they
	// are in it:
	//
	//  1. pprof: first, so that a slow start (and stop) can be profiled
	//     too.
	//  2. the embedded NATS server, then chime's connection, the
	//     responder's and the system account's: everything below is built
	//     on them; they stop last, the connection draining within the
	//     stop's limit.
	//  3. the in-memory views (trigger, WaitFor and task indexes): the
	//     consumers and quotas read them, so they outlive the consumers.
	//  4. the durable consumers (callbacks, waits, tasks' settler,
	//     WaitFor) as one Parallel: with NATS away each waits out its drain
	//     limit, and side by side those do not add up.
	//  5. notifications, the storage monitor, the healer and the history
	//     archiver: background work, stopped before the consumers drain
	//     (records finished meanwhile expire in their buckets).
	//  6. leases then the scheduler (firing): leases first, so that the
	//     shards of the first round load with the scheduler's first pass;
	//     leases are also handed back first, within a second, so the others
	//     take over at once; Start returns once the timer index is loaded.
	//  7. the callout's sessions, the auth callout, the revocations
	//     subscription and the NATS service, then the HTTP gateway: what
	//     takes requests comes up last and stops taking them first.
	//  8. the sweep of records kept without a TTL, behind the start.
	if cfg.PprofAddr != "" {
		if err := r.parts.Start(ctx, newProfiles(cfg.PprofAddr, log)); err != nil {
			return nil, err
		}
	}
	var conns []lifecycle.Service
	if url == "" {
		eo := engine.EmbeddedOptions{Listen: cfg.NATSListen, DataDir: cfg.DataDir}
		if cfg.NATSTLSCert != "" {
			eo.TLS = &engine.EmbeddedTLS{CertFile: cfg.NATSTLSCert, KeyFile: cfg.NATSTLSKey, CAFile: cfg.NATSTLSCA}
		}
		if issuer != nil {
			// chime's own passwords live as long as the process; no one
			// else needs them.
			pub, _ := issuer.PublicKey()
			eo.Auth = &engine.EmbeddedAuth{
				Password: secret.NewToken(""), Issuer: pub, ResponderPassword: secret.NewToken(""),
				ResponderPublish: access.ResponderPublish(), ResponderSubscribe: access.ResponderSubscribe(api.Rights()),
			}
			conn.User, conn.Password = engine.ServiceUser, eo.Auth.Password
			responder.User, responder.Password = engine.ResponderUser, eo.Auth.ResponderPassword
		}
		conns = append(conns, lifecycle.Func(func(ctx context.Context) (err error) {
			if r.ns, err = engine.StartEmbedded(ctx, eo, log); err != nil {
				return err
			}
			conn.Embedded, responder.Embedded = r.ns, r.ns
			return nil
		}, func(context.Context) error {
			if r.ns != nil {
				r.ns.Shutdown()
				r.ns.WaitForShutdown()
			}
			return nil
		}))
	}
	conns = append(conns, lifecycle.Func(func(context.Context) (err error) {
		if r.nc, err = engine.Connect(conn, log); err != nil {
			return err
		}
		r.responder = r.nc
		return nil
	}, func(ctx context.Context) error { return drain(ctx, r.nc) }))
	if issuer != nil {
		conns = append(conns, lifecycle.Func(func(context.Context) (err error) {
			r.responder, err = engine.Connect(responder, log)
			return err
		}, func(context.Context) error {
			if r.responder != nil && r.responder != r.nc {
				// Its service stopped before: the answers left are buffered.
				_ = r.responder.FlushTimeout(time.Second)
				r.responder.Close()
			}
			return nil
		}))
		if url != "" {
			system := conn
			system.Name, system.NkeyFile, system.InboxPrefix = "chime system "+cfg.ReplicaID, cfg.NATSSystemNkeyFile, ""
			conns = append(conns, lifecycle.Func(func(context.Context) (err error) {
				r.system, err = engine.Connect(system, log)
				return err
			}, func(context.Context) error {
				if r.system != nil {
					r.system.Close()
				}
				return nil
			}))
		}
	}
	if err := r.parts.Start(ctx, conns...); err != nil {
		return nil, err
	}
	// An async publish whose ack never comes fails after an attempt's
	// time, as a record write does, so the fire it carried is retried
	// instead of waited on: a publish sent to a stream leader just cut off
	// is sent again once another is elected (acks take under 400 ms in a
	// 20,000-fire burst; a 5 s timeout had fires 13 s late after a 6.6 s
	// election of the inbox stream's leader).
	js, err := jetstream.New(r.nc, jetstream.WithPublishAsyncMaxPending(16384), jetstream.WithPublishAsyncTimeout(kvrec.AttemptTimeout))
	if err != nil {
		return nil, fmt.Errorf("replica: jetstream: %w", err)
	}
	pctx, cancel := context.WithTimeout(startCtx, 30*time.Second)
	defer cancel()
	dedup := cfg.DedupWindow
	if dedup <= 0 {
		dedup = 10 * time.Minute
	}
	layout := partitions.Layout{Partitions: cfg.Partitions, Shards: cfg.Shards}
	topo := engine.Topology{
		Replicas: cfg.JSReplicas, LeaseTTL: cfg.LeaseTTL, Layout: layout,
		InboxMaxAge: cfg.InboxMaxAge, EventMaxAge: cfg.EventMaxAge, DedupWindow: dedup,
		InboxMaxBytes: int64(cfg.InboxMaxBytes), EventMaxBytes: int64(cfg.EventMaxBytes), InboxMaxPerAgent: cfg.InboxMaxPerAgent,
		TaskOutputMaxAge: cfg.RecordRetention, RecordRetention: cfg.RecordRetention, HistoryMaxBytes: int64(cfg.HistoryMaxBytes),
		SessionMaxAge: cfg.NATSSessionMaxAge,
		MaxBytes: map[string]int64{
			engine.TimersBucket: int64(cfg.TimersMaxBytes), engine.WaitsBucket: int64(cfg.WaitsMaxBytes),
			engine.TasksBucket: int64(cfg.TasksMaxBytes), engine.TaskOutputsBucket: int64(cfg.TaskOutputsMaxBytes),
			engine.NotificationsBucket: int64(cfg.NotificationsMaxBytes), engine.QuestionsBucket: int64(cfg.QuestionsMaxBytes), engine.MCPTasksBucket: int64(cfg.MCPTasksMaxBytes),
			engine.MonitorsBucket: int64(cfg.MonitorsMaxBytes),
			engine.WaitForBucket:  int64(cfg.WaitForMaxBytes), engine.IdempotencyBucket: int64(cfg.IdempotencyMaxBytes),
			engine.TokensBucket: int64(cfg.TokensMaxBytes), engine.TriggersBucket: int64(cfg.TriggersMaxBytes),
			engine.AgentsBucket: int64(cfg.AgentsMaxBytes),
		},
	}
	if cfg.NATSAuth {
		// Only the callout writes sessions: without it the bucket stays
		// empty and needs no room reserved.
		topo.MaxBytes[engine.SessionsBucket] = engine.SessionsMaxBytes
	}
	retention := kvrec.Retention{JS: js, After: cfg.RecordRetention, Markers: topo.Markers()}
	res, err := engine.Provision(pctx, js, topo)
	if err != nil {
		return nil, err
	}
	if err := partitions.Check(pctx, js, layout, res.Timers.KVs[0], res.Waits.KVs[0]); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	healer := engine.NewHealer(js, topo, 2*time.Second, log)
	r.storage = engine.NewStorage(engine.StorageConfig{
		JS: js, Probe: res.Leases, ReplicaID: cfg.ReplicaID, Topology: topo, Log: log, Registerer: reg,
	})
	archiver := kvrec.NewArchiver(retention, log)
	archiver.Register(reg)
	store := timers.NewStore(res.Timers, time.Now, retention).
		WithHistory(kvrec.History{JS: js, Stream: engine.HistoryStream, Prefix: engine.HistoryTimers}, archiver)

	agentStore := agents.NewStore(res.Agents)
	waitStore := waits.NewStore(res.Waits, agentStore, time.Now, retention).
		WithHistory(kvrec.History{JS: js, Stream: engine.HistoryStream, Prefix: engine.HistoryWaits}, archiver)

	// The HTTP listener comes first: trigger URLs are built on its address
	// when CHIME_PUBLIC_URL is unset.
	var ln net.Listener
	publicURL := cfg.PublicURL
	if cfg.HTTPAddr != "" {
		var tlsConfig *tls.Config
		if tlsConfig, err = cfg.HTTPTLS(); err != nil {
			return nil, fmt.Errorf("replica: %w", err)
		}
		if ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("replica: the HTTP address %s is in use: set CHIME_HTTP_ADDR to a free address (or empty for no HTTP)", cfg.HTTPAddr)
			}
			return nil, fmt.Errorf("replica: http listen %s (CHIME_HTTP_ADDR): %w", cfg.HTTPAddr, err)
		}
		if tlsConfig != nil {
			ln = tls.NewListener(ln, tlsConfig)
		}
		defer func() {
			if err != nil {
				_ = ln.Close() // the gateway's, if it had one: closed already
			}
		}()
		publicURL = cfg.CallbackBaseURL(ln.Addr().String())
	}
	var operators *access.OperatorTokens
	if cfg.OperatorTokensFile != "" {
		if operators, err = access.LoadOperatorTokens(cfg.OperatorTokensFile); err != nil {
			return nil, err
		}
	} else if cfg.HTTPAddr != "" {
		log.Warn("no operator tokens (CHIME_OPERATOR_TOKENS_FILE): HTTP control routes are open, on loopback only", "addr", cfg.HTTPAddr)
	}
	triggerIndex := callbacks.NewIndex(js, engine.TriggersBucket, engine.AgentsBucket, log)
	triggerStore := callbacks.NewStore(res.Triggers, agentStore, res.Idempotency, res.Leases, publicURL, time.Now, triggerIndex, retention)
	inbox := consumer.NewInbox(js, engine.InboxStream, dedup, time.Now)
	inbox.Register(reg)
	callbackConsumer := callbacks.NewConsumer(callbacks.ConsumerConfig{JS: js, Stream: engine.EventsStream, Store: triggerStore, Inbox: inbox, Log: log, Registerer: reg})
	waitConsumer := waits.NewConsumer(waits.ConsumerConfig{JS: js, Stream: engine.EventsStream, Store: waitStore, Agents: agentStore, Inbox: inbox, Log: log, Registerer: reg})
	// Made before the quotas, which count its timers and waits.
	leases := scheduler.NewLeases(scheduler.LeasesConfig{
		KV: res.Leases, ReplicaID: cfg.ReplicaID, Shards: cfg.Shards, TTL: cfg.LeaseTTL, Renew: cfg.LeaseTTL / 4,
		Log: log, OnChange: func() { r.sched.Reshard() }, Healthy: func() (bool, string) { return r.sched.Healthy() },
	})
	r.sched = scheduler.New(scheduler.Config{
		JS: js, Timers: res.Timers, Waits: res.Waits, Counts: res.Counts, Inbox: inbox, Records: store,
		Leases: leases, Shards: cfg.Shards, Log: log, Registerer: reg,
	})
	waitForIndex := waitfor.NewIndex(js, engine.WaitForBucket, log)
	taskIndex := tasks.NewIndex(js, engine.TasksBucket, log)
	monitorIndex := monitors.NewIndex(js, engine.MonitorsBucket, log)
	var counter quotas.Counter = r.sched
	if layout.Sharded() {
		counter = scheduler.NewCounts(js, res.Counts, time.Now)
	}
	limits := quotas.New(quotas.Config{
		MaxTimers: cfg.MaxTimersPerAgent, MaxWaits: cfg.MaxWaitsPerAgent, MaxQuestions: cfg.MaxOpenQuestions, Counter: counter, MinInterval: cfg.MinInterval,
		Rate: cfg.CreateRate, Burst: cfg.CreateBurst,
		MaxRunningTasks: cfg.MaxRunningTasks, MaxTaskOutputBytes: int64(cfg.MaxTaskOutputBytes), Tasks: taskIndex, TaskStartRate: cfg.TaskStartRate,
		MaxWaitFors: cfg.MaxWaitFors, WaitFors: waitForIndex, NotifyRate: cfg.NotifyRate, MaxStreams: cfg.MaxStreams,
		MaxMCPTasks: cfg.MaxMCPTasks, MaxMonitors: cfg.MaxMonitors,
		Registerer: reg,
	})
	// WaitFor's task check is wired where tasks are (waitfor.TaskLookup).
	waitForStore := waitfor.NewStore(res.WaitFor, time.Now, retention)
	taskStore := tasks.NewStore(tasks.Config{
		KV: res.Tasks, Outputs: res.TaskOutputs, Inbox: inbox, JS: js, Now: time.Now, Retention: retention, Log: log, Admit: limits,
	})
	watchable, err := monitors.NewSubjectPolicy(strings.Split(cfg.MonitorSubjects, ","), engine.InternalSubjects())
	if err != nil {
		return nil, fmt.Errorf("config: CHIME_MONITOR_SUBJECTS: %w", err)
	}
	watchableKV, err := monitors.NewKVPolicy(js, strings.Split(cfg.MonitorKV, ","))
	if err != nil {
		return nil, fmt.Errorf("config: CHIME_MONITOR_KV: %w", err)
	}
	openable, err := monitors.NewURLPolicy(strings.Split(cfg.MonitorURLs, ","))
	if err != nil {
		return nil, fmt.Errorf("config: CHIME_MONITOR_URLS: %w", err)
	}
	monitorStore := monitors.NewStore(monitors.Config{
		KV: res.Monitors, JS: js, Inbox: inbox, Now: time.Now, Retention: retention, Log: log, Admit: limits, Count: monitorIndex,
		Sources: map[string]monitors.Checker{monitors.SourceSubject: watchable, monitors.SourceKV: watchableKV,
			monitors.SourceWS: openable.Checker(monitors.SourceWS), monitors.SourceHTTP: openable.Checker(monitors.SourceHTTP)},
	})
	settler := tasks.NewSettler(tasks.SettlerConfig{JS: js, Stream: engine.EventsStream, Store: taskStore, Log: log, Registerer: reg})
	waitForSvc := waitfor.NewService(waitfor.Config{
		Store: waitForStore, Timers: store, Tasks: waitfor.Tasks{Store: taskStore, Agents: agentStore, JS: js, InboxStream: engine.InboxStream}, Inbox: inbox, JS: js,
		Monitors: monitorStore, InboxStream: engine.InboxStream, EventsStream: engine.EventsStream, Log: log,
	})
	waitForConsumer := waitfor.NewConsumer(waitfor.ConsumerConfig{
		JS: js, Service: waitForSvc, Store: waitForStore, Index: waitForIndex,
		InboxStream: engine.InboxStream, WaitForStream: engine.WaitForStream, Log: log, Registerer: reg,
	})
	tokens := access.NewTokens(res.Tokens, js.Conn(), topo.Markers(), time.Now)
	questionService := questions.NewService(questions.NewStore(res.Questions, time.Now, retention), inbox, log)
	notes := notifications.New(notifications.Config{
		JS: js, KV: res.Notifications, Max: cfg.NotificationsMax, Now: time.Now, Log: log, SanitizeDetail: console.SanitizeDetail,
	})
	reader := deliveries.NewReader(js, engine.InboxStream)
	// The console's fleet view: every agent's state and open counts, from
	// watches of the record buckets.
	fleetIndex := fleet.New(js, fleet.Buckets{
		Timers: bucketNames(res.Timers), Waits: bucketNames(res.Waits), WaitFor: engine.WaitForBucket, Tasks: engine.TasksBucket,
		Questions: engine.QuestionsBucket, Notifications: engine.NotificationsBucket, Monitors: engine.MonitorsBucket, Agents: engine.AgentsBucket,
	}, log)
	ops := api.NewOperations(api.Config{
		Tokens: tokens, Questions: questionService,
		Timers: store, Waits: waitStore, WaitRequests: waits.NewRequests(waitStore, inbox, js, time.Now, log),
		Triggers: triggerStore, Callbacks: callbacks.NewService(triggerStore, inbox, js, engine.InboxStream, time.Now, log), Log: log, TimeZone: cfg.TimeZone,
		Quotas: limits, Registerer: reg, WaitFor: waitForSvc,
		Tasks: taskStore, Monitors: monitorStore, Notifications: notes,
		Agents: agentStore, Deliveries: reader, Inbox: deliveries.NewInbox(reader, agentStore), Fleet: fleetIndex,
	})
	resolver := access.Resolver{Operators: operators, Tokens: tokens, Callbacks: triggerStore}
	parts := []lifecycle.Service{
		triggerIndex, waitForIndex, taskIndex, monitorIndex, fleetIndex, monitors.NewSweeper(monitorStore, monitorIndex, log),
		monitors.NewWatcher(monitors.WatcherConfig{Feeds: map[string]monitors.Feed{monitors.SourceSubject: monitors.SubjectFeed{NC: r.nc},
			monitors.SourceKV: monitors.KVFeed{JS: js},
			monitors.SourceWS: monitors.WSFeed{Policy: openable, Log: log}, monitors.SourceHTTP: monitors.HTTPFeed{Policy: openable, Store: monitorStore, Log: log}},
			Store: monitorStore, Index: monitorIndex, Leases: leases, Shards: cfg.Shards, Log: log}),
		lifecycle.Parallel(callbackConsumer, waitConsumer, settler, waitForConsumer),
		notes, r.storage, healer, archiver,
		lifecycle.Loop(engine.NewQuorumWatch(engine.QuorumConfig{NC: r.nc, JS: js, Log: log}).Run),
		firing{leases: leases, sched: r.sched},
	}
	var sessions *access.Sessions
	if issuer != nil {
		var kick access.Kicker = access.ServerKicker{Server: r.ns}
		if r.system != nil {
			kick = access.SystemKicker{NC: r.system}
		}
		sessions = access.NewSessions(access.SessionsConfig{KV: res.Sessions, Kick: kick, MaxAge: topo.Sessions(), Log: log})
		triggerStore.OnRevoke(func(ctx context.Context, t *callbacks.Trigger) {
			sessions.End(ctx, access.Principal{Kind: access.KindCallback, AgentID: t.AgentID, TriggerID: t.ID})
		})
		parts = append(parts, sessions, access.NewCallout(access.CalloutConfig{
			NC: r.nc, Issuer: issuer, Resolver: resolver, Sessions: sessions, Log: log, Registerer: reg, Rights: api.Rights(),
		}))
	} else {
		log.Warn("NATS authorization is off (CHIME_NATS_AUTH): every client of the NATS server may act as any agent or operator")
	}
	// A revocation ends the agent's connections here (through its session
	// records) and its event streams on every replica.
	tokens.OnRevoke(func(ctx context.Context, agentID string) {
		p := access.Principal{Kind: access.KindAgent, AgentID: agentID}
		sessions.End(ctx, p)
		if err := r.nc.Publish(access.RevokedSubject, []byte(p.Name())); err != nil {
			log.Warn("announcing a revocation: its event streams on other replicas stay open", "principal", p.Name(), "err", err)
		}
	})
	parts = append(parts, lifecycle.Func(func(context.Context) error {
		// Never unsubscribed: the connection's drain ends it.
		if _, err := r.nc.Subscribe(access.RevokedSubject, func(m *nats.Msg) {
			if n := ops.EndStreams(string(m.Data)); n > 0 {
				log.Info("ended the event streams of a revoked principal", "principal", string(m.Data), "streams", n)
			}
		}); err != nil {
			return fmt.Errorf("replica: revocations: %w", err)
		}
		return nil
	}, nil))
	parts = append(parts, api.NewService(api.ServiceConfig{
		NC: r.responder, Ops: ops, Version: version, Confine: issuer != nil, Triggers: triggerStore, Log: log, Registerer: reg,
	}))
	if ln != nil {
		var agentsMCP *mcp.Server
		agentsMCP, err = mcp.New(mcp.Config{
			Table: ops.Table(), Do: ops.Do, Handles: res.MCPTasks, JS: js, Retention: cfg.RecordRetention, Markers: topo.Markers(), Quotas: limits,
			Version: version, Log: log,
		})
		if err != nil {
			return nil, fmt.Errorf("replica: %w", err)
		}
		var h http.Handler = api.NewHandler(ops, reg, r.Readiness, resolver, api.Mount{Pattern: "/api/agents/{id}/mcp", Handler: agentsMCP})
		if cfg.HTTPAccessLog {
			h = api.AccessLog(h, log)
		}
		r.gw = api.NewGateway(ln, h, log, api.DefaultTimeouts())
		parts = append(parts, r.gw)
	}
	parts = append(parts, sweeps(log, store, waitStore, triggerStore, questionService))
	// The parts run under ctx; until they have all started, the start's
	// limit ends it.
	unbind := context.AfterFunc(pctx, func() { r.cancel(context.Cause(pctx)) })
	err = r.parts.Start(ctx, parts...)
	if !unbind() && err == nil {
		err = fmt.Errorf("replica: start: %w", context.Cause(pctx))
	}
	if err != nil {
		if pctx.Err() != nil {
			err = fmt.Errorf("%w (start limit: %w)", err, context.Cause(pctx))
		}
		return nil, err
	}
	r.ready.Store(true)
	where := []any{"replica", cfg.ReplicaID, "version", version, "nats", r.nc.ConnectedUrlRedacted()}
	if r.gw != nil {
		// Where an operator points a browser and a client: the console is
		// the HTTP listener's root.
		base := "http://" + r.gw.Addr()
		if cfg.HTTPTLSCert != "" {
			base = "https://" + r.gw.Addr()
		}
		where = append(where, "http", base, "console", base+"/")
	}
	log.Info("chime ready", where...)
	return r, nil
}

// firing is the leases and the scheduler: leases start first, so that
// the shards of the first round load with the scheduler's first pass, and
// are handed back first, so that the others take over at once.
type firing struct {
	leases *scheduler.Leases
	sched  *scheduler.Scheduler
}

func (f firing) Start(ctx context.Context) error {
	if err := f.leases.Start(ctx); err != nil {
		return err
	}
	return f.sched.Start(ctx)
}

func (f firing) Stop(ctx context.Context) error {
	// Handing leases back saves the others a TTL; it is not worth more of
	// the shutdown limit than that.
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	err := f.leases.Stop(lctx)
	cancel()
	return errors.Join(err, f.sched.Stop(ctx))
}

// drain drains nc within ctx, and closes it when ctx ends first: NATS is
// unreachable, nothing is left to drain to.
func drain(ctx context.Context, nc *nats.Conn) error {
	if nc == nil {
		return nil
	}
	err := nc.Drain()
	for nc.IsDraining() {
		if ctx.Err() != nil {
			nc.Close()
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// sweeps runs sweep behind the start; Stop cancels it and waits.
func sweeps(log *slog.Logger, stores ...sweeper) lifecycle.Service {
	var (
		cancel context.CancelFunc
		wg     sync.WaitGroup
	)
	return lifecycle.Func(func(ctx context.Context) error {
		ctx, cancel = context.WithCancel(ctx)
		wg.Go(func() { sweep(ctx, log, stores...) })
		return nil
	}, func(context.Context) error {
		if cancel != nil {
			cancel()
		}
		wg.Wait()
		return nil
	})
}

// sweeper is a store whose finished records kept without a TTL (from
// before records expired) can be given one.
type sweeper interface {
	Sweep(ctx context.Context) (int, error)
}

// sweep gives what the record buckets kept before records expired their
// TTL. It runs behind the start, not in it: after the first start of this
// version there is nothing left to give one, and it costs one read of
// each bucket.
func sweep(ctx context.Context, log *slog.Logger, stores ...sweeper) {
	for _, s := range stores {
		n, err := s.Sweep(ctx)
		if n > 0 {
			log.Info("records kept without a TTL now expire", "records", n)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("sweep of finished records; the next start tries again", "err", err)
		}
	}
}

// Ready reports whether the replica serves requests and fires timers.
func (r *Replica) Ready() bool {
	ok, _ := r.Readiness()
	return ok
}

// Readiness is Ready with the reason when not: still starting, NATS
// unreachable, JetStream's store full (writes refused), or the scheduler
// unable to fire (its watches stale, its publishes failing), in which
// case it has given its shards away.
func (r *Replica) Readiness() (bool, string) {
	switch {
	case !r.ready.Load():
		return false, "starting or stopping"
	case !r.nc.IsConnected():
		return false, "not connected to NATS (" + r.nc.Status().String() + ")"
	case !r.responder.IsConnected():
		return false, "the responder is not connected to NATS (" + r.responder.Status().String() + ")"
	}
	if full, why := r.storage.Full(); full {
		return false, "storage full: " + why
	}
	if ok, why := r.sched.Healthy(); !ok {
		return false, "cannot fire: " + why
	}
	return true, ""
}

// HTTPAddr is the bound HTTP address, empty without a gateway.
func (r *Replica) HTTPAddr() string {
	if r.gw == nil {
		return ""
	}
	return r.gw.Addr()
}

// NATSURL is the client URL agents use: the embedded server's, or the configured one.
func (r *Replica) NATSURL() string {
	if r.ns != nil {
		return r.ns.ClientURL()
	}
	return r.cfg.NATSURL
}

// Stop shuts down within ctx: the parts stop in the reverse of their start
// order (see Start), what takes new work first, the consumers drained
// before NATS is closed.
func (r *Replica) Stop(ctx context.Context) {
	r.once.Do(func() {
		r.ready.Store(false)
		err := r.parts.Stop(ctx)
		if r.cancel != nil {
			r.cancel(errors.New("replica stopped"))
		}
		if err != nil {
			r.log.Warn("shutdown", "err", err)
		}
		r.log.Info("chime stopped")
	})
}

// calloutIssuer is the key that signs the users chime admits, nil when
// NATS authorization is off: the configured seed, or for the embedded
// server one made for this run (the server learns its public key at start).
func calloutIssuer(cfg *config.Config) (nkeys.KeyPair, error) {
	if !cfg.NATSAuth {
		return nil, nil
	}
	if cfg.NATSCalloutKeyFile == "" {
		kp, err := nkeys.CreateAccount()
		if err != nil {
			return nil, fmt.Errorf("replica: callout key: %w", err)
		}
		return kp, nil
	}
	return access.LoadIssuer(cfg.NATSCalloutKeyFile)
}

// bucketNames names a record kind's partition buckets.
func bucketNames(s *partitions.Set) []string {
	out := make([]string, len(s.KVs))
	for i, kv := range s.KVs {
		out[i] = kv.Bucket()
	}
	return out
}
