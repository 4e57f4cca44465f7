// Package metrics holds stepready's Prometheus collectors. Every method is safe on a nil *Metrics, so the
// machinery records unconditionally and embedding users may run without metrics.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is the set of collectors one daemon exports.
type Metrics struct {
	claimed         prometheus.Counter
	started         prometheus.Counter
	completed       prometheus.Counter
	failed          *prometheus.CounterVec
	retries         prometheus.Counter
	released        prometheus.Counter
	reaped          prometheus.Counter
	pruned          prometheus.Counter
	claimLatency    prometheus.Histogram
	readyToStart    prometheus.Histogram
	attemptDuration prometheus.Histogram
	inFlight        prometheus.Gauge
}

// New creates the collectors and registers them with reg (nil: not registered anywhere).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		claimed: prometheus.NewCounter(prometheus.CounterOpts{Name: "stepready_steps_claimed_total",
			Help: "Steps claimed by this daemon (claim_ready_steps rows)."}),
		started: prometheus.NewCounter(prometheus.CounterOpts{Name: "stepready_attempts_started_total",
			Help: "Attempts started (start_step returned an attempt number)."}),
		completed: prometheus.NewCounter(prometheus.CounterOpts{Name: "stepready_attempts_completed_total",
			Help: "Attempts recorded as successful (complete_step or continue_step)."}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stepready_attempts_failed_total",
			Help: "Attempts recorded as failed, by failure class."}, []string{"class"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "stepready_retries_scheduled_total",
			Help: "Failures that scheduled a retry (fail_step returned waiting_for_retry)."}),
		released: prometheus.NewCounter(prometheus.CounterOpts{Name: "stepready_attempts_released_total",
			Help: "Attempts handed back uncharged at shutdown (release_step)."}),
		reaped: prometheus.NewCounter(prometheus.CounterOpts{Name: "stepready_lease_reaps_total",
			Help: "Steps whose lease expired and were handled by the reaper."}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{Name: "stepready_pruned_tasks_total",
			Help: "Finished tasks deleted by retention (prune_tasks), with their steps and events."}),
		claimLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "stepready_claim_seconds",
			Help: "Duration of one claim (and dispatch) round trip.", Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16)}),
		readyToStart: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "stepready_claim_to_start_seconds",
			Help: "Time from a step's claim to its attempt's start on a worker.", Buckets: prometheus.ExponentialBuckets(0.0002, 2, 18)}),
		attemptDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "stepready_attempt_seconds",
			Help: "Handler run time of one attempt.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20)}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "stepready_attempts_in_flight",
			Help: "Attempts running on this daemon now."}),
	}
	if reg != nil {
		reg.MustRegister(m.claimed, m.started, m.completed, m.failed, m.retries, m.released, m.reaped, m.pruned,
			m.claimLatency, m.readyToStart, m.attemptDuration, m.inFlight)
	}
	return m
}

// Claimed records a claim of n steps that took d.
func (m *Metrics) Claimed(n int, d time.Duration) {
	if m == nil {
		return
	}
	m.claimed.Add(float64(n))
	m.claimLatency.Observe(d.Seconds())
}

// Started records an attempt start, d after its claim.
func (m *Metrics) Started(sinceClaim time.Duration) {
	if m == nil {
		return
	}
	m.started.Inc()
	m.inFlight.Inc()
	if sinceClaim > 0 {
		m.readyToStart.Observe(sinceClaim.Seconds())
	}
}

// Finished records the end of an attempt that ran for d (whatever its outcome).
func (m *Metrics) Finished(d time.Duration) {
	if m == nil {
		return
	}
	m.inFlight.Dec()
	m.attemptDuration.Observe(d.Seconds())
}

// Completed records a successful attempt.
func (m *Metrics) Completed() {
	if m != nil {
		m.completed.Inc()
	}
}

// Failed records a failed attempt of class; retry says whether a retry was scheduled.
func (m *Metrics) Failed(class string, retry bool) {
	if m == nil {
		return
	}
	m.failed.WithLabelValues(class).Inc()
	if retry {
		m.retries.Inc()
	}
}

// Released records an attempt handed back at shutdown.
func (m *Metrics) Released() {
	if m != nil {
		m.released.Inc()
	}
}

// Pruned records n tasks deleted by retention.
func (m *Metrics) Pruned(n int) {
	if m != nil {
		m.pruned.Add(float64(n))
	}
}

// Reaped records n steps handled by the lease reaper.
func (m *Metrics) Reaped(n int) {
	if m != nil && n > 0 {
		m.reaped.Add(float64(n))
	}
}
