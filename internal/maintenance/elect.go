package maintenance

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/store"
)

// The advisory lock keys of the services' elections: "StepXxx\x01" in ASCII, one per service, so that each
// service's rounds are elected independently. Only this file names them.
const (
	lockLeaseReaper      int64 = 0x5374_6570_5265_7001 // "StepRep\x01"
	lockTaskPruner       int64 = 0x5374_6570_5072_6e01 // "StepPrn\x01"
	lockFlowKeyPruner    int64 = 0x5374_6570_466c_6b01 // "StepFlk\x01"
	lockScheduleEnqueuer int64 = 0x5374_6570_5363_6801 // "StepSch\x01"
	lockBacklogExporter  int64 = 0x5374_6570_426b_6c01 // "StepBkl\x01"
)

// elect runs round while this instance holds the election of key, and reports whether it won it. The election
// is a transaction holding pg_try_advisory_xact_lock(key) for the whole round; round gets that transaction
// (work that must be atomic with the election, such as firing schedules, runs in it) and may use other
// connections of the pool for work in transactions of its own (batches). The transaction is committed when
// round succeeds, rolled back otherwise. An instance that loses returns at once with won = false.
func elect(ctx context.Context, pool *pgxpool.Pool, key int64, round func(ctx context.Context, tx pgx.Tx) error) (won bool, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("election: %w", err)
	}
	defer func() {
		if err != nil {
			// The rollback must happen even when ctx ended: it releases the lock and the connection.
			err = errors.Join(err, ignoreClosed(tx.Rollback(context.WithoutCancel(ctx))))
		}
	}()
	if won, err = store.TryAdvisoryXactLock(ctx, tx, key); err != nil || !won {
		if err == nil {
			err = ignoreClosed(tx.Rollback(ctx))
		}
		return false, err
	}
	if err = round(ctx, tx); err != nil {
		return true, err
	}
	if err = tx.Commit(ctx); err != nil {
		return true, fmt.Errorf("election: commit: %w", err)
	}
	return true, nil
}

func ignoreClosed(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}
