package scheduler

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/partitions"
)

type metrics struct {
	active, waitGauge prometheus.GaugeFunc
	shardsHeld        prometheus.GaugeFunc
	shardsStalled     prometheus.GaugeFunc
	countsPending     prometheus.GaugeFunc
	shardLoad         prometheus.Histogram
	fires, failures   prometheus.Counter
	duplicates        prometheus.Counter
	applied           prometheus.Counter
	recordFailures    prometheus.Counter
	recovered         prometheus.Counter
	adopted           prometheus.Counter
	progress          prometheus.Counter
	lateness          prometheus.Histogram
	refused           *prometheus.CounterVec
	// changes counts the watch entries handed to applyTimer and
	// applyWait, by bucket base name: what this replica receives and
	// decodes of the fleet's writes (every change of every partition in
	// the unsharded layout, its shards' share in the sharded one).
	// timerChanges and waitChanges are its two children, resolved once so
	// that counting costs one atomic add.
	changes                   *prometheus.CounterVec
	timerChanges, waitChanges prometheus.Counter
}

func newMetrics(s *Scheduler) metrics {
	m := metrics{
		fires: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_timer_fires_total", Help: "Timer occurrences stored in inboxes by this replica.",
		}),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "chime_timer_fire_lateness_seconds",
			Help:    "Time from a timer's or wait's due time to the first publish of its fire.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_timer_fire_publish_failures_total", Help: "Fire publishes that failed or went unacknowledged and were retried.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_fire_duplicates_total",
			Help: "Timer and wait fire publishes the stream acknowledged as duplicates: stored before, by an earlier attempt or another replica.",
		}),
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_timer_fires_applied_total", Help: "Delivered timer occurrences written into their records (repeats not counted).",
		}),
		recordFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_timer_record_failures_total", Help: "Timer record updates that failed and were retried.",
		}),
		recovered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_timer_fires_found_delivered_total", Help: "Overdue occurrences older than the dedup window found already in the inbox, and not published again.",
		}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_timer_cadence_adopted_total", Help: "Repeating timer fires found stored already with another next due time, whose cadence was taken from the stored one.",
		}),
		progress: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_wait_progress_total", Help: "Wait progress messages published by this replica.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_records_refused_total",
			Help: "Records passed over by the index, by bucket: undecodable, or naming another agent or ID than their key. Chime wrote none of them.",
		}, []string{"bucket"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_scheduler_changes_total",
			Help: "Timer and wait changes this replica's watches delivered to its scheduler, by bucket (the kind's first bucket name).",
		}, []string{"bucket"}),
	}
	timers, waits := "chime_timers", "chime_waits"
	if s.cfg.Timers != nil {
		timers = partitions.Base(s.cfg.Timers.KVs[0].Bucket())
	}
	if s.cfg.Waits != nil {
		waits = partitions.Base(s.cfg.Waits.KVs[0].Bucket())
	}
	m.timerChanges, m.waitChanges = m.changes.WithLabelValues(timers), m.changes.WithLabelValues(waits)
	m.shardLoad = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "chime_shard_load_seconds",
		Help:    "Time from gaining a shard's lease to holding its timers and waits, ready to fire.",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	m.waitGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "chime_waits_active", Help: "Waiting waits this replica holds: those of the shards it owns.",
	}, func() float64 { return float64(s.activeCount(true)) })
	m.active = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "chime_timers_active", Help: "Active timers this replica holds: those of the shards it owns.",
	}, func() float64 { return float64(s.activeCount(false)) })
	m.shardsHeld = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "chime_shards_held", Help: "Shards whose timers and waits this replica holds.",
	}, func() float64 { return float64(s.ShardsHeld()) })
	m.shardsStalled = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "chime_shards_stalled",
		Help: "Shards this replica holds whose earliest timer or wait is more than 10 s overdue and not fired; the log says why.",
	}, func() float64 { return float64(s.stalled.Load()) })
	if s.counts != nil {
		m.countsPending = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "chime_counts_pending", Help: "Per-agent counts of held shards changed and not yet written to chime_counts (sharded layout).",
		}, func() float64 { return float64(s.counts.pending()) })
	}
	return m
}

func (m *metrics) register(r prometheus.Registerer) {
	if m.countsPending != nil {
		r.MustRegister(m.countsPending)
	}
	r.MustRegister(m.active, m.waitGauge, m.shardsHeld, m.shardsStalled, m.shardLoad, m.fires, m.failures, m.duplicates, m.applied, m.recordFailures, m.recovered, m.adopted, m.progress, m.lateness, m.refused, m.changes)
}
