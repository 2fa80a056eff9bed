package consumer

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Termination reasons, the reason label of chime_consumer_terminated_total.
const (
	ReasonPoison     = "poison"      // the handler said it can never be applied
	ReasonMaxDeliver = "max_deliver" // it failed on its last delivery
	ReasonPanic      = "panic"       // its handler panicked on its last delivery
)

// Metrics are the pools' collectors. One set serves every pool of a
// registerer: the consumer name is a label.
type Metrics struct {
	terminated *prometheus.CounterVec
	panics     *prometheus.CounterVec
	recreated  *prometheus.CounterVec
}

// NewMetrics returns the pools' collectors registered with reg (nil
// registers none). Asking again with the same reg returns collectors
// backed by the ones already registered, so every feature may call it
// with the registerer it was given.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		terminated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_consumer_terminated_total",
			Help: "Messages a consumer gave up on (terminated, never redelivered), by consumer and reason (poison, max_deliver, panic).",
		}, []string{"consumer", "reason"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_consumer_handler_panics_total",
			Help: "Handler panics recovered by a consumer pool; the message is redelivered unless it was its last delivery.",
		}, []string{"consumer"}),
		recreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_consumer_recreated_total",
			Help: "Times a pool re-created its durable consumer after it was deleted or lost.",
		}, []string{"consumer"}),
	}
	if reg != nil {
		m.terminated = register(reg, m.terminated)
		m.panics = register(reg, m.panics)
		m.recreated = register(reg, m.recreated)
	}
	return m
}

// register registers c, or returns the identical collector registered
// before.
func register(reg prometheus.Registerer, c *prometheus.CounterVec) *prometheus.CounterVec {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var dup prometheus.AlreadyRegisteredError
	if errors.As(err, &dup) {
		if existing, ok := dup.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing
		}
	}
	panic(err) // a clashing definition is a programming error, as with MustRegister
}

// init creates the series of consumer at zero, so a dashboard sees them
// before the first event.
func (m *Metrics) init(consumer string) {
	for _, r := range []string{ReasonPoison, ReasonMaxDeliver, ReasonPanic} {
		m.terminated.WithLabelValues(consumer, r)
	}
	m.panics.WithLabelValues(consumer)
	m.recreated.WithLabelValues(consumer)
}
