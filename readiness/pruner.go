package readiness

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/metrics"
	"github.com/stepready/stepready/internal/store"
)

// PrunerLockKey is the transaction advisory lock that elects the one pruner of each batch ("StepPrn\x01").
const PrunerLockKey int64 = 0x5374_6570_5072_6e01

// Pruner defaults.
const (
	// PruneBatchDefault is how many tasks one prune_tasks call deletes at most.
	PruneBatchDefault = 1000
	// PruneQueryTimeout bounds one batch; a batch that takes longer is cancelled and retried next round.
	PruneQueryTimeout = 30 * time.Second
	// prunePause is the longest pause between two batches of a round (a random part of it is taken), so that a
	// large backlog is deleted as many short transactions rather than one long one.
	prunePause = 50 * time.Millisecond
)

// Pruner deletes finished tasks older than their retention (SPEC §13), then the state of idle flow control keys
// (SPEC §14), every Interval, on whichever instance wins the advisory lock of each batch: one instance deletes at
// a time however many daemons run. A round deletes in batches of Batch until a batch comes back short, each
// batch its own transaction with a timeout, with a short jittered pause between batches.
type Pruner struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Interval between rounds. Required (> 0).
	Interval time.Duration
	// RetentionComplete is how long complete tasks are kept after they finished; < 0 keeps them forever.
	RetentionComplete time.Duration
	// RetentionFailed is how long error and cancelled tasks are kept after they finished; < 0 keeps them
	// forever.
	RetentionFailed time.Duration
	// Batch is the most tasks, or flow keys, one batch deletes (0: PruneBatchDefault).
	Batch int
	// Logger receives the pruner's logs. Required.
	Logger *slog.Logger
	// Metrics counts pruned tasks (nil: none).
	Metrics *metrics.Metrics
	// OnRound, when set, is called after every round with the number of tasks it deleted (tests wait on it).
	OnRound func(deleted int)
}

// Run prunes until ctx is done: finished tasks (none when both retentions are negative), then idle flow keys,
// every Interval.
func (p *Pruner) Run(ctx context.Context) error {
	t := time.NewTicker(p.Interval)
	defer t.Stop()
	for {
		n, err := p.PruneOnce(ctx)
		if err != nil && ctx.Err() == nil {
			p.Logger.Error("readiness: prune finished tasks", slog.Any("error", err))
		}
		if n > 0 {
			p.Logger.Info("readiness: pruned finished tasks", slog.Int("tasks", n))
		}
		// After the tasks: keys whose last steps were just deleted are idle now.
		k, err := p.PruneFlowKeys(ctx)
		if err != nil && ctx.Err() == nil {
			p.Logger.Error("readiness: prune idle flow keys", slog.Any("error", err))
		}
		if k > 0 {
			p.Logger.Info("readiness: pruned idle flow keys", slog.Int("keys", k))
		}
		if p.OnRound != nil {
			p.OnRound(n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// PruneOnce runs one round: for each retention that is not negative, batches until one comes back short. It
// returns how many tasks it deleted.
func (p *Pruner) PruneOnce(ctx context.Context) (int, error) {
	total := 0
	for _, r := range []struct {
		keep     time.Duration
		statuses []string
	}{
		{p.RetentionComplete, []string{"complete"}},
		{p.RetentionFailed, []string{"error", "cancelled"}},
	} {
		if r.keep < 0 {
			continue
		}
		n, err := p.drain(ctx, func(ctx context.Context, tx pgx.Tx, limit int) (int, error) {
			// The cut-off is the database's now minus keep.
			var cutoff time.Time
			if err := tx.QueryRow(ctx, `SELECT now() - make_interval(secs => $1)`, r.keep.Seconds()).Scan(&cutoff); err != nil {
				return 0, fmt.Errorf("readiness: pruner cut-off: %w", err)
			}
			return store.PruneTasks(ctx, tx, cutoff, r.statuses, limit)
		})
		p.Metrics.Pruned(n)
		total += n
		if err != nil || ctx.Err() != nil {
			return total, err
		}
	}
	return total, nil
}

// PruneFlowKeys deletes the flow_state rows of idle flow control keys (stepready.prune_flow_state: nothing in
// flight, bucket full, no wake-up pending) in batches until one comes back short. It returns how many rows it
// deleted. A key's row is created again by its next claim; its override in flow_limits is never touched.
func (p *Pruner) PruneFlowKeys(ctx context.Context) (int, error) {
	return p.drain(ctx, func(ctx context.Context, tx pgx.Tx, limit int) (int, error) {
		return store.PruneFlowState(ctx, tx, limit)
	})
}

// drain runs batches of del (see elected) until one comes back short, with a short jittered pause between them,
// and returns how many rows the committed batches deleted. It stops without error when ctx ends between batches.
func (p *Pruner) drain(ctx context.Context, del func(ctx context.Context, tx pgx.Tx, limit int) (int, error)) (int, error) {
	total := 0
	for {
		n, full, err := p.elected(ctx, del)
		total += n
		if err != nil || !full {
			return total, err
		}
		select {
		case <-ctx.Done():
			return total, nil
		case <-time.After(rand.N(prunePause)):
		}
	}
}

// elected runs del in a transaction under PruneQueryTimeout (the ctx del gets) if this instance wins the pruner's
// advisory lock (else it deletes nothing), with the batch size as its limit; full reports whether del deleted a
// whole batch.
func (p *Pruner) elected(ctx context.Context, del func(ctx context.Context, tx pgx.Tx, limit int) (int, error)) (n int, full bool, err error) {
	limit := p.Batch
	if limit <= 0 {
		limit = PruneBatchDefault
	}
	ctx, cancel := context.WithTimeout(ctx, PruneQueryTimeout)
	defer cancel()
	err = pgx.BeginFunc(ctx, p.Pool, func(tx pgx.Tx) error {
		var leader bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, PrunerLockKey).Scan(&leader); err != nil {
			return fmt.Errorf("readiness: pruner election: %w", err)
		}
		if !leader {
			return nil
		}
		var err error
		n, err = del(ctx, tx, limit)
		return err
	})
	if err != nil {
		return 0, false, err
	}
	return n, n == limit, nil
}
