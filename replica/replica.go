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
	"sync"
	"sync/atomic"
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
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/secret"
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
	system   *nats.Conn
	sessions *access.Sessions
	// revoked ends this replica's event streams of revoked principals.
	revoked *nats.Subscription
	healer  *engine.Healer
	waits   *waits.Consumer
	waitFor *waitfor.Consumer
	settler *tasks.Settler
	storage *engine.Storage
	// waitForIndex is this replica's view of WaitFor's scope index.
	waitForIndex *waitfor.Index
	// taskIndex counts running tasks and stored output, for the quotas.
	taskIndex *tasks.Index
	callbacks *callbacks.Consumer
	// triggerIndex resolves callback tokens in memory.
	triggerIndex *callbacks.Index
	sched        *scheduler.Scheduler
	leases       *scheduler.Leases
	svc          *api.Service
	callout      *access.Callout
	notes        *notifications.Service
	gw           *api.Gateway
	profiles     *profiles // nil without CHIME_PPROF_ADDR
	ready        atomic.Bool
	cancel       context.CancelFunc
	once         sync.Once
	Version      string
	// archiver moves finished timers and ended waits to CHIME_HISTORY.
	archiver *kvrec.Archiver

	// sweeps runs the start's sweep of records kept without a TTL.
	sweeps sync.WaitGroup
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
	ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if cfg.PprofAddr != "" {
		// First, so that a slow start can be profiled too.
		if r.profiles, err = startProfiles(cfg.PprofAddr, log); err != nil {
			return nil, err
		}
	}

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
		if r.ns, err = engine.StartEmbedded(ctx, eo, log); err != nil {
			return nil, err
		}
		conn.Embedded, responder.Embedded = r.ns, r.ns
	}
	if r.nc, err = engine.Connect(conn, log); err != nil {
		return nil, err
	}
	r.responder = r.nc
	if issuer != nil {
		if r.responder, err = engine.Connect(responder, log); err != nil {
			return nil, err
		}
		if url != "" {
			system := conn
			system.Name, system.NkeyFile, system.InboxPrefix = "chime system "+cfg.ReplicaID, cfg.NATSSystemNkeyFile, ""
			if r.system, err = engine.Connect(system, log); err != nil {
				return nil, err
			}
		}
	}
	// An async publish whose ack never comes fails after the timeout, so
	// the fire it carried is retried instead of waited on forever.
	js, err := jetstream.New(r.nc, jetstream.WithPublishAsyncMaxPending(16384), jetstream.WithPublishAsyncTimeout(5*time.Second))
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
			engine.NotificationsBucket: int64(cfg.NotificationsMaxBytes), engine.QuestionsBucket: int64(cfg.QuestionsMaxBytes),
			engine.WaitForBucket: int64(cfg.WaitForMaxBytes), engine.IdempotencyBucket: int64(cfg.IdempotencyMaxBytes),
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
	r.healer = engine.NewHealer(js, topo, 2*time.Second, log)
	if err := r.healer.Start(ctx); err != nil {
		return nil, err
	}
	r.storage = engine.NewStorage(engine.StorageConfig{
		JS: js, Probe: res.Leases, ReplicaID: cfg.ReplicaID, Topology: topo, Log: log, Registerer: reg,
	})
	if err := r.storage.Start(ctx); err != nil {
		return nil, err
	}
	r.archiver = kvrec.NewArchiver(retention, log)
	r.archiver.Register(reg)
	r.archiver.Start(ctx)
	store := timers.NewStore(res.Timers, time.Now, retention).
		WithHistory(kvrec.History{JS: js, Stream: engine.HistoryStream, Prefix: engine.HistoryTimers}, r.archiver)

	agentStore := agents.NewStore(res.Agents)
	waitStore := waits.NewStore(res.Waits, agentStore, time.Now, retention).
		WithHistory(kvrec.History{JS: js, Stream: engine.HistoryStream, Prefix: engine.HistoryWaits}, r.archiver)

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
			return nil, fmt.Errorf("replica: http listen %s: %w", cfg.HTTPAddr, err)
		}
		if tlsConfig != nil {
			ln = tls.NewListener(ln, tlsConfig)
		}
		defer func() {
			if r.gw == nil {
				_ = ln.Close()
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
	if r.triggerIndex, err = callbacks.StartIndex(pctx, js, engine.TriggersBucket, engine.AgentsBucket, log); err != nil {
		return nil, err
	}
	triggerStore := callbacks.NewStore(res.Triggers, agentStore, res.Idempotency, res.Leases, publicURL, time.Now, r.triggerIndex, retention)
	inbox := consumer.NewInbox(js, engine.InboxStream, dedup, time.Now)
	inbox.Register(reg)
	r.callbacks = callbacks.NewConsumer(callbacks.ConsumerConfig{JS: js, Stream: engine.EventsStream, Store: triggerStore, Inbox: inbox, Log: log, Registerer: reg})
	if err := r.callbacks.Start(ctx); err != nil {
		return nil, err
	}

	r.waits = waits.NewConsumer(waits.ConsumerConfig{JS: js, Stream: engine.EventsStream, Store: waitStore, Agents: agentStore, Inbox: inbox, Log: log, Registerer: reg})
	if err := r.waits.Start(ctx); err != nil {
		return nil, err
	}
	// Made here, started below: the quotas count its timers and waits.
	r.leases = scheduler.NewLeases(scheduler.LeasesConfig{
		KV: res.Leases, ReplicaID: cfg.ReplicaID, Shards: cfg.Shards, TTL: cfg.LeaseTTL, Renew: cfg.LeaseTTL / 4,
		Log: log, OnChange: func() { r.sched.Reshard() }, Healthy: func() (bool, string) { return r.sched.Healthy() },
	})
	r.sched = scheduler.New(scheduler.Config{
		JS: js, Timers: res.Timers, Waits: res.Waits, Counts: res.Counts, Inbox: inbox, Records: store,
		Leases: r.leases, Shards: cfg.Shards, Log: log, Registerer: reg,
	})
	if r.waitForIndex, err = waitfor.StartIndex(pctx, js, engine.WaitForBucket, log); err != nil {
		return nil, err
	}
	if r.taskIndex, err = tasks.StartIndex(pctx, js, engine.TasksBucket, log); err != nil {
		return nil, err
	}
	var counter quotas.Counter = r.sched
	if layout.Sharded() {
		counter = scheduler.NewCounts(js, res.Counts, time.Now)
	}
	limits := quotas.New(quotas.Config{
		MaxTimers: cfg.MaxTimersPerAgent, MaxWaits: cfg.MaxWaitsPerAgent, MaxQuestions: cfg.MaxOpenQuestions, Counter: counter, MinInterval: cfg.MinInterval,
		Rate: cfg.CreateRate, Burst: cfg.CreateBurst,
		MaxRunningTasks: cfg.MaxRunningTasks, MaxTaskOutputBytes: int64(cfg.MaxTaskOutputBytes), Tasks: r.taskIndex, TaskStartRate: cfg.TaskStartRate,
		MaxWaitFors: cfg.MaxWaitFors, WaitFors: r.waitForIndex, NotifyRate: cfg.NotifyRate, MaxStreams: cfg.MaxStreams,
		Registerer: reg,
	})
	// WaitFor's task check is wired where tasks are (waitfor.TaskLookup).
	waitForStore := waitfor.NewStore(res.WaitFor, time.Now, retention)
	taskStore := tasks.NewStore(tasks.Config{
		KV: res.Tasks, Outputs: res.TaskOutputs, Inbox: inbox, JS: js, Now: time.Now, Retention: retention, Log: log, Admit: limits,
	})
	r.settler = tasks.NewSettler(tasks.SettlerConfig{JS: js, Stream: engine.EventsStream, Store: taskStore, Log: log, Registerer: reg})
	if err := r.settler.Start(ctx); err != nil {
		return nil, err
	}
	waitForSvc := waitfor.NewService(waitfor.Config{
		Store: waitForStore, Timers: store, Tasks: waitfor.Tasks{Store: taskStore}, Inbox: inbox, JS: js,
		InboxStream: engine.InboxStream, EventsStream: engine.EventsStream, Log: log,
	})
	r.waitFor = waitfor.NewConsumer(waitfor.ConsumerConfig{
		JS: js, Service: waitForSvc, Store: waitForStore, Index: r.waitForIndex,
		InboxStream: engine.InboxStream, WaitForStream: engine.WaitForStream, Log: log, Registerer: reg,
	})
	if err := r.waitFor.Start(ctx); err != nil {
		return nil, err
	}
	// Leases first: the shards of the first round load with the
	// scheduler's first pass over the buckets instead of a second one.
	if err := r.leases.Start(ctx); err != nil {
		return nil, err
	}
	if err := r.sched.Start(ctx); err != nil {
		return nil, err
	}
	select {
	case <-r.sched.Ready():
	case <-pctx.Done():
		return nil, fmt.Errorf("replica: loading the timer index: %w", pctx.Err())
	}
	tokens := access.NewTokens(res.Tokens, topo.Markers(), time.Now)
	questionService := questions.NewService(questions.NewStore(res.Questions, time.Now, retention), inbox, log)
	r.notes = notifications.New(notifications.Config{
		JS: js, KV: res.Notifications, Max: cfg.NotificationsMax, Now: time.Now, Log: log, SanitizeDetail: console.SanitizeDetail,
	})
	if err := r.notes.Start(ctx); err != nil {
		return nil, err
	}
	select {
	case <-r.notes.Loaded():
	case <-pctx.Done():
		return nil, fmt.Errorf("replica: loading the notifications: %w", pctx.Err())
	}
	reader := deliveries.NewReader(js, engine.InboxStream)
	ops := api.NewOperations(api.Config{
		Tokens: tokens, Questions: questionService,
		Timers: store, Waits: waitStore, WaitRequests: waits.NewRequests(waitStore, inbox, js, time.Now, log),
		Triggers: triggerStore, Callbacks: callbacks.NewService(triggerStore, inbox, js, engine.InboxStream, time.Now, log), Log: log, TimeZone: cfg.TimeZone,
		Quotas: limits, Registerer: reg, WaitFor: waitForSvc,
		Tasks: taskStore, Notifications: r.notes,
		Agents: agentStore, Deliveries: reader, Inbox: deliveries.NewInbox(reader, agentStore),
	})
	resolver := access.Resolver{Operators: operators, Tokens: tokens, Callbacks: triggerStore}
	if issuer != nil {
		var kick access.Kicker = access.ServerKicker{Server: r.ns}
		if r.system != nil {
			kick = access.SystemKicker{NC: r.system}
		}
		r.sessions = access.NewSessions(access.SessionsConfig{KV: res.Sessions, Kick: kick, MaxAge: topo.Sessions(), Log: log})
		triggerStore.OnRevoke(func(ctx context.Context, t *callbacks.Trigger) {
			r.sessions.End(ctx, access.Principal{Kind: access.KindCallback, AgentID: t.AgentID, TriggerID: t.ID})
		})
		if r.callout, err = access.StartCallout(ctx, access.CalloutConfig{
			NC: r.nc, Issuer: issuer, Resolver: resolver, Sessions: r.sessions, Log: log, Registerer: reg, Rights: api.Rights(),
		}); err != nil {
			return nil, err
		}
	} else {
		log.Warn("NATS authorization is off (CHIME_NATS_AUTH): every client of the NATS server may act as any agent or operator")
	}
	// A revocation ends the agent's connections here (through its session
	// records) and its event streams on every replica.
	tokens.OnRevoke(func(ctx context.Context, agentID string) {
		p := access.Principal{Kind: access.KindAgent, AgentID: agentID}
		r.sessions.End(ctx, p)
		if err := r.nc.Publish(access.RevokedSubject, []byte(p.Name())); err != nil {
			log.Warn("announcing a revocation: its event streams on other replicas stay open", "principal", p.Name(), "err", err)
		}
	})
	if r.revoked, err = r.nc.Subscribe(access.RevokedSubject, func(m *nats.Msg) {
		if n := ops.EndStreams(string(m.Data)); n > 0 {
			log.Info("ended the event streams of a revoked principal", "principal", string(m.Data), "streams", n)
		}
	}); err != nil {
		return nil, fmt.Errorf("replica: revocations: %w", err)
	}
	if r.svc, err = api.StartService(ctx, api.ServiceConfig{
		NC: r.responder, Ops: ops, Version: version, Confine: issuer != nil, Triggers: triggerStore, Log: log, Registerer: reg,
	}); err != nil {
		return nil, err
	}
	if ln != nil {
		r.gw = api.StartGateway(ln, api.NewHandler(ops, reg, r.Readiness, resolver), log, api.DefaultTimeouts())
	}
	r.ready.Store(true)
	log.Info("chime ready", "replica", cfg.ReplicaID, "version", version, "nats", r.nc.ConnectedUrlRedacted())
	r.sweeps.Go(func() { sweep(ctx, log, store, waitStore, triggerStore, questionService) })
	return r, nil
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

// Stop shuts down within ctx, in two stages: stop taking new work (HTTP, service,
// leases handed back, scheduler), drain the consumer, then close NATS.
func (r *Replica) Stop(ctx context.Context) {
	r.once.Do(func() {
		r.ready.Store(false)
		var errs []error
		if r.gw != nil {
			errs = append(errs, r.gw.Stop(ctx))
		}
		if r.profiles != nil {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			errs = append(errs, r.profiles.stop(pctx))
			cancel()
		}
		if r.svc != nil {
			errs = append(errs, r.svc.Stop())
		}
		r.callout.Stop()
		r.sessions.Stop()
		if r.leases != nil {
			// Handing leases back saves the others a TTL; it is not worth
			// more of the shutdown limit than that.
			lctx, cancel := context.WithTimeout(ctx, time.Second)
			r.leases.Stop(lctx)
			cancel()
		}
		if r.sched != nil {
			r.sched.Stop()
		}
		r.archiver.Stop()
		if r.healer != nil {
			r.healer.Stop()
		}
		if r.storage != nil {
			r.storage.Stop()
		}
		if r.notes != nil {
			r.notes.Stop()
		}
		// The consumers drain side by side: with NATS away each waits out
		// its drain limit, and those add up.
		var drains sync.WaitGroup
		if r.waits != nil {
			drains.Go(r.waits.Stop)
		}
		if r.callbacks != nil {
			drains.Go(r.callbacks.Stop)
		}
		if r.waitFor != nil {
			drains.Go(r.waitFor.Stop)
		}
		if r.settler != nil {
			drains.Go(r.settler.Stop)
		}
		drains.Wait()
		if r.cancel != nil {
			r.cancel()
		}
		r.sweeps.Wait()
		if r.triggerIndex != nil {
			r.triggerIndex.Stop()
		}
		if r.waitForIndex != nil {
			r.waitForIndex.Stop()
		}
		if r.taskIndex != nil {
			r.taskIndex.Stop()
		}
		if r.system != nil {
			r.system.Close()
		}
		if r.responder != nil && r.responder != r.nc {
			// Its service stopped above: the answers left are buffered.
			_ = r.responder.FlushTimeout(time.Second)
			r.responder.Close()
		}
		if r.nc != nil {
			if err := r.nc.Drain(); err != nil {
				errs = append(errs, err)
			}
			for r.nc.IsDraining() {
				if ctx.Err() != nil {
					r.nc.Close() // NATS is unreachable: nothing left to drain to
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		if r.ns != nil {
			r.ns.Shutdown()
			r.ns.WaitForShutdown()
		}
		if err := errors.Join(errs...); err != nil {
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
