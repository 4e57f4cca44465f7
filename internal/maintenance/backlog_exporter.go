package maintenance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepready/stepready/internal/store"
)

// BacklogExporterIntervalDefault is how often the elected instance reads the backlog into the gauges.
const BacklogExporterIntervalDefault = 10 * time.Second

// flowReasons are the flow-control reasons the gauges always carry (SPEC §14).
var flowReasons = []string{"concurrency_limited", "rate_limited"}

// BacklogExporterConfig configures a BacklogExporter. Zero values take the defaults.
type BacklogExporterConfig struct {
	// Interval between rounds (default BacklogExporterIntervalDefault; Off exports no backlog gauges).
	Interval time.Duration
	// Timeout bounds one round (default TimeoutDefault).
	Timeout time.Duration
}

// BacklogExporter sets the backlog gauges (stepready_steps_ready, _in_flight, _waiting_for_retry,
// _due_within_minute, stepready_oldest_ready_seconds per queue: queue_stats) and the flow-control gauges
// (stepready_flow_blocked_steps and _keys per reason: flow_status) and the map gauges (stepready_map_steps_running,
// stepready_map_elements by state: map_stats) and the gauges of waiting for the world (stepready_steps_waiting by
// reason, stepready_signals_received, _delivered and _buffered: signal_stats) on the elected instance of each round. Every
// other instance exports none of them, so that a sum over instances is the backlog. The elected instance exports
// every queue it has seen (and "default"), at 0 when nothing waits there, so an alert on a gauge never sees it
// vanish.
type BacklogExporter struct {
	env Env
	cfg BacklogExporterConfig

	mu     sync.Mutex
	queues map[string]bool // queues exported before: exported at 0 when they have no backlog
}

// NewBacklogExporter checks cfg and builds the service.
func NewBacklogExporter(env Env, cfg BacklogExporterConfig) (*BacklogExporter, error) {
	cfg.Interval = cmp.Or(cfg.Interval, BacklogExporterIntervalDefault)
	cfg.Timeout = cmp.Or(cfg.Timeout, TimeoutDefault)
	if err := errors.Join(env.validate(), checkInterval("BacklogExporterConfig.Interval", cfg.Interval),
		checkBatch("BacklogExporterConfig", 1, cfg.Timeout)); err != nil {
		return nil, fmt.Errorf("maintenance: backlog exporter: %w", err)
	}
	return &BacklogExporter{env: env.withDefaults(), cfg: cfg, queues: map[string]bool{"default": true}}, nil
}

func (b *BacklogExporter) name() string         { return "backlog exporter" }
func (b *BacklogExporter) every() time.Duration { return b.cfg.Interval }

func (b *BacklogExporter) round(ctx context.Context) (time.Duration, error) {
	_, err := b.RunOnce(ctx)
	return 0, err
}

// RunOnce runs one round: the elected instance reads queue_stats and flow_status in one snapshot and sets the
// gauges; any other instance clears them. It reports whether this instance was elected.
func (b *BacklogExporter) RunOnce(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	var (
		stats []store.QueueStat
		flow  []store.FlowKey
		maps  store.MapStats
		waits store.SignalStats
	)
	won, err := elect(ctx, b.env.Pool, lockBacklogExporter, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if stats, err = store.QueueStats(ctx, tx); err != nil {
			return err
		}
		if flow, err = store.FlowStatus(ctx, tx); err != nil {
			return err
		}
		if maps, err = store.ReadMapStats(ctx, tx); err != nil {
			return err
		}
		waits, err = store.ReadSignalStats(ctx, tx)
		return err
	})
	m := b.env.Metrics
	if err != nil || !won {
		m.ResetQueueBacklog()
		if err != nil {
			return won, fmt.Errorf("maintenance: backlog exporter: %w", err)
		}
		return false, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	m.ResetQueueBacklog()
	seen := map[string]bool{}
	for _, s := range stats {
		m.QueueBacklog(s.Queue, s.Ready, s.InFlight, s.WaitingForRetry, s.DueWithinMinute, s.OldestReadySeconds)
		seen[s.Queue] = true
		b.queues[s.Queue] = true
	}
	for q := range b.queues {
		if !seen[q] {
			m.QueueBacklog(q, 0, 0, 0, 0, 0)
		}
	}
	// What flow control holds back, by reason only (a label per key would be unbounded).
	keys, steps := map[string]int{}, map[string]int{}
	for _, k := range flow {
		if k.Blocked != "" {
			keys[k.Blocked]++
			steps[k.Blocked] += k.Waiting
		}
	}
	for _, reason := range flowReasons {
		m.FlowBlocked(reason, keys[reason], steps[reason])
	}
	m.MapProgress(maps.Maps, maps.Elements, maps.Done, maps.Failed, maps.InFlight)
	m.Waiting(waits.WaitingForSignal, waits.Sleeping, waits.Received, waits.Delivered, waits.Buffered)
	return true, nil
}
