package maintenance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepready/stepready/internal/store"
)

// Task pruner defaults (SPEC §13).
const (
	// TaskPrunerIntervalDefault is how often the elected instance prunes finished tasks.
	TaskPrunerIntervalDefault = time.Minute
	// RetentionCompleteDefault is how long complete tasks are kept after they finished: a week.
	RetentionCompleteDefault = 168 * time.Hour
	// RetentionFailedDefault is how long error and cancelled tasks are kept after they finished: 30 days.
	RetentionFailedDefault = 720 * time.Hour
)

// KeepForever, as a retention, keeps those tasks forever. It is Off: -1.
const KeepForever = Off

// TaskPrunerConfig configures a TaskPruner. Zero values take the defaults.
type TaskPrunerConfig struct {
	// Interval between rounds (default TaskPrunerIntervalDefault; Off turns pruning off).
	Interval time.Duration
	// RetentionComplete is how long complete tasks are kept after they finished (default
	// RetentionCompleteDefault; KeepForever keeps them).
	RetentionComplete time.Duration
	// RetentionFailed is how long error and cancelled tasks are kept after they finished (default
	// RetentionFailedDefault; KeepForever keeps them).
	RetentionFailed time.Duration
	// Batch is the most tasks one prune_tasks call deletes (default BatchDefault).
	Batch int
	// Timeout bounds one batch (default TimeoutDefault).
	Timeout time.Duration
}

// TaskPruner deletes finished tasks past their retention, with their steps, edges and events
// (stepready.prune_tasks), on the elected instance of each round.
type TaskPruner struct {
	env Env
	cfg TaskPrunerConfig
}

// NewTaskPruner checks cfg and builds the service.
func NewTaskPruner(env Env, cfg TaskPrunerConfig) (*TaskPruner, error) {
	cfg.Interval = cmp.Or(cfg.Interval, TaskPrunerIntervalDefault)
	cfg.RetentionComplete = cmp.Or(cfg.RetentionComplete, RetentionCompleteDefault)
	cfg.RetentionFailed = cmp.Or(cfg.RetentionFailed, RetentionFailedDefault)
	cfg.Batch = cmp.Or(cfg.Batch, BatchDefault)
	cfg.Timeout = cmp.Or(cfg.Timeout, TimeoutDefault)
	errs := []error{env.validate(), checkInterval("TaskPrunerConfig.Interval", cfg.Interval),
		checkBatch("TaskPrunerConfig", cfg.Batch, cfg.Timeout)}
	for field, keep := range map[string]time.Duration{"RetentionComplete": cfg.RetentionComplete,
		"RetentionFailed": cfg.RetentionFailed} {
		if keep < 0 && keep != KeepForever {
			errs = append(errs, fmt.Errorf("TaskPrunerConfig.%s must be > 0, or KeepForever (-1); got %s", field, keep))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("maintenance: task pruner: %w", err)
	}
	return &TaskPruner{env: env.withDefaults(), cfg: cfg}, nil
}

func (p *TaskPruner) name() string         { return "task pruner" }
func (p *TaskPruner) every() time.Duration { return p.cfg.Interval }

func (p *TaskPruner) round(ctx context.Context) (time.Duration, error) {
	n, err := p.RunOnce(ctx)
	return logRound(p.env.Logger, p.name(), "pruned finished tasks", n, err)
}

// RunOnce runs one round if this instance wins its election: for each retention that is not KeepForever,
// batches until one comes back short. It returns how many tasks it deleted.
func (p *TaskPruner) RunOnce(ctx context.Context) (int, error) {
	total := 0
	_, err := elect(ctx, p.env.Pool, lockTaskPruner, func(ctx context.Context, _ pgx.Tx) error {
		for _, r := range []struct {
			keep     time.Duration
			statuses []string
		}{
			{p.cfg.RetentionComplete, []string{"complete"}},
			{p.cfg.RetentionFailed, []string{"error", "cancelled"}},
		} {
			if r.keep == KeepForever {
				continue
			}
			n, err := drain(ctx, p.cfg.Batch, p.cfg.Timeout, func(ctx context.Context, limit int) (int, error) {
				cutoff, err := store.FinishedBefore(ctx, p.env.Pool, r.keep)
				if err != nil {
					return 0, err
				}
				k, err := store.PruneTasks(ctx, p.env.Pool, cutoff, r.statuses, limit)
				p.env.Metrics.Pruned(k)
				return k, err
			})
			total += n
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return total, fmt.Errorf("maintenance: task pruner: %w", err)
	}
	return total, nil
}
