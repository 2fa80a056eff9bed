package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// BenchmarkCalendarVersusJetStreamCron measures, in one run on one
// embedded nats-server, how late a per-second cron fires: K chime calendar
// timers ("* * * * * *" in Europe/Berlin) against K JetStream message
// schedules with the same cron and zone (Nats-Schedule, nats-server
// 2.14+). Lateness is the time the stream stored the fire (its message
// timestamp) minus the scheduled second: chime's envelope says its
// scheduled time; a JetStream fire's is its stored time's second (it
// fires within the second; a later one would be counted a second short).
//
//	go test ./scheduler -run '^$' -bench CalendarVersusJetStreamCron -benchtime 1x
//
// K is 50 timers and as many schedules, over 15 s.
func BenchmarkCalendarVersusJetStreamCron(b *testing.B) {
	const k, seconds = 50, 15
	for range b.N {
		chime, js := calendarVersusCron(b, k, seconds*time.Second)
		for _, r := range []struct {
			name string
			late []time.Duration
		}{{"chime", chime}, {"jetstream", js}} {
			p50, p99, mx := quantiles(r.late)
			b.ReportMetric(float64(p50.Microseconds())/1000, r.name+"_p50_ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, r.name+"_p99_ms")
			b.ReportMetric(float64(mx.Microseconds())/1000, r.name+"_max_ms")
			b.ReportMetric(float64(len(r.late)), r.name+"_fires")
			b.Logf("%-9s %4d fires  p50 %8s  p99 %8s  max %8s", r.name, len(r.late), p50, p99, mx)
		}
	}
}

func quantiles(d []time.Duration) (p50, p99, mx time.Duration) {
	if len(d) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2], s[min(len(s)-1, len(s)*99/100)], s[len(s)-1]
}

// calendarVersusCron runs both for d and returns each one's lateness.
func calendarVersusCron(b *testing.B, k int, d time.Duration) (chime, js []time.Duration) {
	ns := natstest.Server(b)
	_, res := natstest.Provisioned(b, ns)
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()

	// JetStream's own: a stream that allows schedules, K schedules.
	st, err := res.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "CRONBENCH", Subjects: []string{"cronbench.>"}, AllowMsgSchedules: true, Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	// chime's: K calendar timers, fired by one replica.
	store := timers.NewStore(res.Timers, nil, kvrec.Retention{JS: res.JS})
	spec, err := timers.DecodeCreateTimer([]byte(`{"cron":"* * * * * *","tz":"Europe/Berlin"}`), timers.TimerLimits{})
	if err != nil {
		b.Fatal(err)
	}
	stop := calReplica(b, res, store, nil)
	defer stop()

	start := time.Now()
	for i := range k {
		m := &nats.Msg{Subject: fmt.Sprintf("cronbench.sched.%d", i), Header: nats.Header{}}
		m.Header.Set("Nats-Schedule", "* * * * * *")
		m.Header.Set("Nats-Schedule-Time-Zone", "Europe/Berlin")
		m.Header.Set("Nats-Schedule-Target", fmt.Sprintf("cronbench.fired.%d", i))
		if _, err := res.JS.PublishMsg(ctx, m); err != nil {
			b.Fatal(err)
		}
		if _, err := store.Create(ctx, "calbench", spec); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(d)
	end := time.Now()

	// JetStream's fires: the targets' stored times.
	js = lateness(b, st, "cronbench.fired.>", start, end, func(m jetstream.Msg, stored time.Time) time.Time {
		return stored.Truncate(time.Second)
	})
	inbox, err := res.JS.Stream(ctx, engine.InboxStream)
	if err != nil {
		b.Fatal(err)
	}
	chime = lateness(b, inbox, subjects.Inbox("calbench"), start, end, func(m jetstream.Msg, _ time.Time) time.Time {
		var env subjects.Envelope
		var data timers.TimerFiredData
		if json.Unmarshal(m.Data(), &env) != nil || json.Unmarshal(env.Data, &data) != nil || data.ScheduledAt == nil {
			return time.Time{}
		}
		return *data.ScheduledAt
	})
	return chime, js
}

// lateness reads the stream's messages on subject stored between start
// and end, and returns each one's stored time minus its scheduled time.
func lateness(b *testing.B, st jetstream.Stream, subject string, start, end time.Time, scheduled func(jetstream.Msg, time.Time) time.Time) []time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		b.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var out []time.Duration
	for pending := int(info.NumPending); pending > 0; {
		batch, err := cons.Fetch(min(pending, 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		for m := range batch.Messages() {
			pending--
			md, err := m.Metadata()
			if err != nil {
				b.Fatal(err)
			}
			s := scheduled(m, md.Timestamp)
			// Whole seconds after the start and before the end only: the
			// first and last may be partly outside either's window.
			if s.IsZero() || !s.After(start.Add(time.Second)) || s.After(end.Add(-time.Second)) {
				continue
			}
			out = append(out, md.Timestamp.Sub(s))
		}
		if batch.Error() != nil {
			b.Fatal(batch.Error())
		}
	}
	return out
}
