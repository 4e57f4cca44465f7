package maintenance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stepready/stepready/internal/store"
)

// FlowKeyPrunerIntervalDefault is how often the elected instance deletes the state of idle flow-control keys.
const FlowKeyPrunerIntervalDefault = time.Minute

// FlowKeyPrunerConfig configures a FlowKeyPruner. Zero values take the defaults.
type FlowKeyPrunerConfig struct {
	// Interval between rounds (default FlowKeyPrunerIntervalDefault; Off keeps one flow_state row for every key
	// ever claimed).
	Interval time.Duration
	// Batch is the most keys one prune_flow_state call deletes (default BatchDefault).
	Batch int
	// Timeout bounds one batch (default TimeoutDefault).
	Timeout time.Duration
}

// FlowKeyPruner deletes the flow_state rows of idle flow-control keys (stepready.prune_flow_state: nothing in
// flight, bucket full, no wake-up pending) on the elected instance of each round. A key's row is created again by
// its next claim; its override in flow_limits is never touched.
type FlowKeyPruner struct {
	env Env
	cfg FlowKeyPrunerConfig
}

// NewFlowKeyPruner checks cfg and builds the service.
func NewFlowKeyPruner(env Env, cfg FlowKeyPrunerConfig) (*FlowKeyPruner, error) {
	cfg.Interval = cmp.Or(cfg.Interval, FlowKeyPrunerIntervalDefault)
	cfg.Batch = cmp.Or(cfg.Batch, BatchDefault)
	cfg.Timeout = cmp.Or(cfg.Timeout, TimeoutDefault)
	if err := errors.Join(env.validate(), checkInterval("FlowKeyPrunerConfig.Interval", cfg.Interval),
		checkBatch("FlowKeyPrunerConfig", cfg.Batch, cfg.Timeout)); err != nil {
		return nil, fmt.Errorf("maintenance: flow key pruner: %w", err)
	}
	return &FlowKeyPruner{env: env.withDefaults(), cfg: cfg}, nil
}

func (p *FlowKeyPruner) name() string         { return "flow key pruner" }
func (p *FlowKeyPruner) every() time.Duration { return p.cfg.Interval }

func (p *FlowKeyPruner) round(ctx context.Context) (time.Duration, error) {
	n, err := p.RunOnce(ctx)
	return logRound(p.env.Logger, p.name(), "pruned idle flow keys", n, err)
}

// RunOnce runs one round if this instance wins its election: batches until one comes back short. It returns
// how many keys' rows it deleted.
func (p *FlowKeyPruner) RunOnce(ctx context.Context) (int, error) {
	return electedDrain(ctx, p.env, lockFlowKeyPruner, p.name(), p.cfg.Batch, p.cfg.Timeout,
		func(ctx context.Context, limit int) (int, error) { return store.PruneFlowState(ctx, p.env.Pool, limit) })
}
