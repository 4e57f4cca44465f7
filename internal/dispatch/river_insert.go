package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/stepready/stepready/internal/store"
)

// batchInsertError is River refusing an InsertManyTx of claimed steps' jobs. The claim's transaction is rolled
// back with it, and Dispatch claims again with one job per savepoint (insertEach).
type batchInsertError struct{ err error }

func (e *batchInsertError) Error() string { return "dispatch: insert river jobs: " + e.err.Error() }
func (e *batchInsertError) Unwrap() error { return e.err }

// failUnusable fails, in the claim's transaction tx, every claimed step whose row the runtime cannot use
// (store.ClaimedStep.Check), and returns the others: the steps whose jobs are to be inserted.
func (r *River) failUnusable(ctx context.Context, tx pgx.Tx, claimed []store.ClaimedStep) ([]store.ClaimedStep, error) {
	jobs := claimed[:0:0]
	for _, c := range claimed {
		if !r.cfg.skipCheck {
			if err := c.Check(); err != nil {
				if err := r.cfg.Executor.FailUndispatchable(ctx, tx, c, err); err != nil {
					return nil, err
				}
				continue
			}
		}
		jobs = append(jobs, c)
	}
	return jobs, nil
}

// insertEach inserts the job of each step on its own, under a savepoint of the claim's transaction tx. A job that
// River refuses (its validation of the job's parameters) or that PostgreSQL refuses for its values (SQLSTATE
// classes 22, 23, 54) fails its step alone, with class deterministic; any other error (the connection, the
// database) ends the claim, which is rolled back. It returns the steps whose jobs were inserted, with their
// results.
func (r *River) insertEach(ctx context.Context, tx pgx.Tx, jobs []store.ClaimedStep, params []river.InsertManyParams) (
	[]store.ClaimedStep, []*rivertype.JobInsertResult, error) {
	inserted := jobs[:0:0]
	var results []*rivertype.JobInsertResult
	for i, c := range jobs {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("dispatch: savepoint: %w", err)
		}
		res, err := r.client.InsertManyTx(ctx, sp, params[i:i+1])
		if err == nil {
			if err := sp.Commit(ctx); err != nil {
				return nil, nil, fmt.Errorf("dispatch: release savepoint: %w", err)
			}
			inserted = append(inserted, c)
			results = append(results, res...)
			continue
		}
		// A savepoint that cannot be rolled back means the connection or the transaction is gone: not the job.
		if rbErr := sp.Rollback(ctx); rbErr != nil || !refusedForItsValues(err) {
			return nil, nil, fmt.Errorf("dispatch: insert the river job of step %d: %w", c.StepID, err)
		}
		r.logger().Warn("dispatch: River refused the job of one step; the step fails",
			slog.Int64("step_id", c.StepID), slog.Int64("task_id", c.TaskID), slog.Any("error", err))
		if err := r.cfg.Executor.FailUndispatchable(ctx, tx, c, fmt.Errorf("River refused its job: %w", err)); err != nil {
			return nil, nil, err
		}
	}
	return inserted, results, nil
}

// refusedForItsValues reports whether err, from inserting one job, is about that job rather than about the
// database or the connection: River's own validation of the job's parameters (a Go error, before any SQL), or
// PostgreSQL refusing its values (data exception 22, integrity constraint 23, program limit 54).
func refusedForItsValues(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, pgx.ErrTxClosed) {
		return false
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23") ||
			strings.HasPrefix(pgErr.Code, "54")
	}
	return !pgconn.SafeToRetry(err) && !pgconn.Timeout(err)
}

// logger is the configured logger, or one that discards.
func (r *River) logger() *slog.Logger {
	if r.cfg.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.cfg.Logger
}
