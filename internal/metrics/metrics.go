// Package metrics holds stepready's Prometheus collectors. Every method is safe on a nil *Metrics, so the
// machinery records unconditionally and embedding users may run without metrics.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is the set of collectors one daemon exports.
type Metrics struct {
	claimed   prometheus.Counter
	started   prometheus.Counter
	completed prometheus.Counter
	failed    *prometheus.CounterVec
	retries   prometheus.Counter
	released  prometheus.Counter
	reaped    prometheus.Counter
	pruned    prometheus.Counter
	// The backlog per queue (queue_stats), set by the elected instance only.
	queueReady, queueInFlight, queueWaiting, queueDueSoon, queueLag *prometheus.GaugeVec
	// Flow control (SPEC §14) by reason, never by key: set by the elected instance only.
	flowSteps, flowKeys *prometheus.GaugeVec
	// Maps running now (SPEC §19): their number and their elements by state; set by the elected instance only.
	mapSteps    prometheus.Gauge
	mapElements *prometheus.GaugeVec
	// Waiting for the world (SPEC §20): steps waiting by reason, and the mailbox; set by the elected instance only.
	stepsWaiting                                       *prometheus.GaugeVec
	signalsReceived, signalsDelivered, signalsBuffered prometheus.Gauge
	claimLatency                                       prometheus.Histogram
	readyToStart                                       prometheus.Histogram
	attemptDuration                                    prometheus.Histogram
	inFlight                                           prometheus.Gauge
	// Schedules (SPEC §15), counted by the instance that fired them.
	scheduleFires, scheduleErrors *prometheus.CounterVec
}

// New creates the collectors and registers them with reg (nil: not registered anywhere).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		claimed: prometheus.NewCounter(prometheus.CounterOpts{Name: "stepready_steps_claimed_total",
			Help: "Steps claimed by this daemon (claim_ready_steps rows)."}),
		started: prometheus.NewCounter(prometheus.CounterOpts{Name: "stepready_attempts_started_total",
			Help: "Attempts started (start_step returned a fencing token)."}),
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
		queueReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "stepready_steps_ready",
			Help: "Steps ready to be claimed now, per queue (set by the elected instance)."}, []string{"queue"}),
		queueInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "stepready_steps_in_flight",
			Help: "Steps enqueued or in progress, per queue (set by the elected instance)."}, []string{"queue"}),
		queueWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "stepready_steps_waiting_for_retry",
			Help: "Steps waiting out a retry backoff, per queue (set by the elected instance)."}, []string{"queue"}),
		queueDueSoon: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "stepready_steps_due_within_minute",
			Help: "Steps that become ready within a minute, per queue (set by the elected instance)."}, []string{"queue"}),
		queueLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "stepready_oldest_ready_seconds",
			Help: "How long the oldest ready step has waited to be claimed, per queue: the scheduling lag (set by the elected instance)."}, []string{"queue"}),
		flowSteps: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "stepready_flow_blocked_steps",
			Help: "Steps otherwise ready that flow control holds back, by reason (concurrency_limited, rate_limited; set by the elected instance)."}, []string{"reason"}),
		flowKeys: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "stepready_flow_blocked_keys",
			Help: "Flow control keys at their limit with steps waiting, by reason (set by the elected instance)."}, []string{"reason"}),
		mapSteps: prometheus.NewGauge(prometheus.GaugeOpts{Name: "stepready_map_steps_running",
			Help: "Map steps in progress that have fanned out (elected instance only)."}),
		mapElements: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "stepready_map_elements",
			Help: "Elements of the map steps in progress, by state: done, failed, in_flight, other (elected instance only)."},
			[]string{"state"}),
		stepsWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "stepready_steps_waiting",
			Help: "Wait steps waiting now, by reason: waiting_for_signal, sleeping (elected instance only)."},
			[]string{"reason"}),
		signalsReceived: prometheus.NewGauge(prometheus.GaugeOpts{Name: "stepready_signals_received",
			Help: "Signals in the mailbox: every signal sent to a task not yet pruned (elected instance only)."}),
		signalsDelivered: prometheus.NewGauge(prometheus.GaugeOpts{Name: "stepready_signals_delivered",
			Help: "Signals in the mailbox that a wait step consumed (elected instance only)."}),
		signalsBuffered: prometheus.NewGauge(prometheus.GaugeOpts{Name: "stepready_signals_buffered",
			Help: "Signals in the mailbox not consumed yet: their step has not started waiting (elected instance only)."}),
		claimLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "stepready_claim_seconds",
			Help: "Duration of one claim (and dispatch) round trip.", Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16)}),
		readyToStart: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "stepready_claim_to_start_seconds",
			Help: "Time from a step's claim to its attempt's start on a worker.", Buckets: prometheus.ExponentialBuckets(0.0002, 2, 18)}),
		attemptDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "stepready_attempt_seconds",
			Help: "Handler run time of one attempt.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20)}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "stepready_attempts_in_flight",
			Help: "Attempts running on this daemon now."}),
		scheduleFires: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stepready_schedule_fires_total",
			Help: "Schedule fire times handled by this instance as leader, by outcome."}, []string{"outcome"}),
		scheduleErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stepready_schedule_errors_total",
			Help: "Schedule fires that failed (missing or invalid template, invalid cron or time zone)."},
			[]string{"schedule"}),
	}
	if reg != nil {
		reg.MustRegister(m.claimed, m.started, m.completed, m.failed, m.retries, m.released, m.reaped, m.pruned,
			m.queueReady, m.queueInFlight, m.queueWaiting, m.queueDueSoon, m.queueLag, m.flowSteps, m.flowKeys,
			m.mapSteps, m.mapElements, m.stepsWaiting, m.signalsReceived, m.signalsDelivered, m.signalsBuffered,
			m.claimLatency, m.readyToStart, m.attemptDuration, m.inFlight, m.scheduleFires, m.scheduleErrors)
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

// QueueBacklog sets the backlog gauges of one queue; ResetQueueBacklog clears them all (an instance that is not
// the elected one exports none, so that a sum over instances is the backlog).
func (m *Metrics) QueueBacklog(queue string, ready, inFlight, waiting, dueSoon int64, lagSeconds float64) {
	if m == nil {
		return
	}
	m.queueReady.WithLabelValues(queue).Set(float64(ready))
	m.queueInFlight.WithLabelValues(queue).Set(float64(inFlight))
	m.queueWaiting.WithLabelValues(queue).Set(float64(waiting))
	m.queueDueSoon.WithLabelValues(queue).Set(float64(dueSoon))
	m.queueLag.WithLabelValues(queue).Set(lagSeconds)
}

// ResetQueueBacklog removes every queue's backlog gauges.
func (m *Metrics) ResetQueueBacklog() {
	if m == nil {
		return
	}
	for _, g := range []*prometheus.GaugeVec{m.queueReady, m.queueInFlight, m.queueWaiting, m.queueDueSoon, m.queueLag,
		m.flowSteps, m.flowKeys, m.mapElements, m.stepsWaiting} {
		g.Reset()
	}
	for _, g := range []prometheus.Gauge{m.mapSteps, m.signalsReceived, m.signalsDelivered, m.signalsBuffered} {
		g.Set(0)
	}
}

// Waiting sets the gauges of waiting for the world (SPEC §20): the wait steps waiting now by reason, and the
// mailbox's signals received, delivered and buffered. Cleared by ResetQueueBacklog.
func (m *Metrics) Waiting(forSignal, sleeping, received, delivered, buffered int64) {
	if m == nil {
		return
	}
	m.stepsWaiting.WithLabelValues("waiting_for_signal").Set(float64(forSignal))
	m.stepsWaiting.WithLabelValues("sleeping").Set(float64(sleeping))
	m.signalsReceived.Set(float64(received))
	m.signalsDelivered.Set(float64(delivered))
	m.signalsBuffered.Set(float64(buffered))
}

// MapProgress sets the map gauges: maps map steps in progress with elements elements, of which done complete or
// resolved, failed in error, inFlight enqueued or in progress (the rest, "other", wait). Cleared by
// ResetQueueBacklog.
func (m *Metrics) MapProgress(maps, elements, done, failed, inFlight int64) {
	if m == nil {
		return
	}
	m.mapSteps.Set(float64(maps))
	m.mapElements.WithLabelValues("done").Set(float64(done))
	m.mapElements.WithLabelValues("failed").Set(float64(failed))
	m.mapElements.WithLabelValues("in_flight").Set(float64(inFlight))
	m.mapElements.WithLabelValues("other").Set(float64(max(elements-done-failed-inFlight, 0)))
}

// FlowBlocked sets the flow control gauges of one reason: keys at their limit with steps waiting, and those
// steps. Cleared by ResetQueueBacklog.
func (m *Metrics) FlowBlocked(reason string, keys, steps int) {
	if m == nil {
		return
	}
	m.flowKeys.WithLabelValues(reason).Set(float64(keys))
	m.flowSteps.WithLabelValues(reason).Set(float64(steps))
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

// ScheduleFired records one fire time handled by the schedule enqueuer, by outcome (fired, skipped, failed,
// stale).
func (m *Metrics) ScheduleFired(outcome string) {
	if m != nil {
		m.scheduleFires.WithLabelValues(outcome).Inc()
	}
}

// ScheduleErrored records a fire of schedule that failed.
func (m *Metrics) ScheduleErrored(schedule string) {
	if m != nil {
		m.scheduleErrors.WithLabelValues(schedule).Inc()
	}
}
