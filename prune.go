package stepready

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/stepready/stepready/internal/store"
)

// PruneBatch is how many tasks one prune_tasks call of Prune deletes at most.
const PruneBatch = 1000

// PruneOptions say what Prune deletes.
type PruneOptions struct {
	// OlderThan: tasks that finished (completed_at) more than this long ago by the database's clock. Required,
	// >= 0.
	OlderThan time.Duration
	// Statuses are the finished statuses pruned: complete, cancelled, error (default complete and cancelled, as
	// prune_tasks).
	Statuses []string
	// DryRun counts what would be deleted and deletes nothing. It still checks that the caller may run the real
	// prune, so a dry run that succeeds is followed by a real run that is not refused for want of privileges.
	DryRun bool
}

// PruneResult is what Prune did.
type PruneResult struct {
	// Pruned is how many tasks were deleted, or with DryRun would be.
	Pruned int `json:"pruned"`
	// DryRun is true when nothing was deleted.
	DryRun bool `json:"dry_run"`
	// FinishedBefore is the cut-off: the database's now minus OlderThan.
	FinishedBefore time.Time `json:"finished_before"`
	// Statuses are the task statuses pruned.
	Statuses []string `json:"statuses"`
}

// Prune deletes, in batches of PruneBatch (each its own transaction) until none is left, the finished tasks that
// opts selects, with their steps, edges and events (stepready.prune_tasks; docs/operating.md): a one-off clean-up. A
// running daemon prunes on its own, by its retentions. Unfinished tasks, templates and schedules are never
// touched.
func Prune(ctx context.Context, db DBTX, opts PruneOptions) (*PruneResult, error) {
	if opts.OlderThan < 0 {
		return nil, fmt.Errorf("stepready: Prune: OlderThan %s: must be 0 or more", opts.OlderThan)
	}
	statuses := []string{}
	for _, s := range cmpOr(opts.Statuses, []string{"complete", "cancelled"}) {
		if !slices.Contains([]string{"complete", "cancelled", "error"}, s) {
			return nil, fmt.Errorf("stepready: Prune: status %q: only finished tasks are pruned (complete, cancelled, error)", s)
		}
		if !slices.Contains(statuses, s) {
			statuses = append(statuses, s)
		}
	}
	res := &PruneResult{DryRun: opts.DryRun, Statuses: statuses}
	var err error
	if res.FinishedBefore, err = store.FinishedBefore(ctx, db, opts.OlderThan); err != nil {
		return nil, err
	}
	if opts.DryRun {
		if err := store.CheckExecute(ctx, db, "stepready.prune_tasks(timestamptz, text[], int)"); err != nil {
			return nil, err
		}
		res.Pruned, err = store.CountPrunable(ctx, db, res.FinishedBefore, statuses)
		return res, err
	}
	for {
		n, err := store.PruneTasks(ctx, db, res.FinishedBefore, statuses, PruneBatch)
		res.Pruned += n
		if err != nil {
			return res, err
		}
		if n < PruneBatch {
			return res, nil
		}
	}
}

func cmpOr[T any](v, def []T) []T {
	if len(v) == 0 {
		return def
	}
	return v
}
