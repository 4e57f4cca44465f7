package maintenance_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/maintenance"
)

// The task pruner deletes, in one round and in batches, the finished tasks past each retention, and nothing
// else; KeepForever keeps a status's tasks; another instance's round makes this one a no-op.
func TestTaskPrunerDrainsEachRetentionInOneRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// 25 complete tasks finished two hours ago, 5 cancelled ones, 3 unfinished, 4 complete just now.
	for range 25 + 5 + 3 + 4 {
		b.task(1, "default")
	}
	b.exec(`UPDATE stepready.steps SET state = 'complete' WHERE task_id IN (SELECT id FROM stepready.tasks ORDER BY id LIMIT 25)
		OR task_id IN (SELECT id FROM stepready.tasks ORDER BY id DESC LIMIT 4)`)
	b.exec(`SELECT stepready.cancel_task(id) FROM stepready.tasks WHERE status = 'pending' ORDER BY id LIMIT 5`)
	b.exec(`UPDATE stepready.tasks SET completed_at = now() - interval '2 hours'
		WHERE id NOT IN (SELECT id FROM stepready.tasks ORDER BY id DESC LIMIT 4)`)
	require.Equal(t, 29, b.count(`SELECT count(*) FROM stepready.tasks WHERE status = 'complete'`))

	p, err := maintenance.NewTaskPruner(b.env, maintenance.TaskPrunerConfig{RetentionComplete: time.Hour,
		RetentionFailed: maintenance.KeepForever, Batch: 10})
	require.NoError(t, err)
	release := b.holdLock(maintenance.LockTaskPruner)
	n, err := p.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	release()

	n, err = p.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 25, n, "three batches of 10 (the last short) in one round")
	require.Equal(t, 4, b.count(`SELECT count(*) FROM stepready.tasks WHERE status = 'complete'`))
	require.Equal(t, 5, b.count(`SELECT count(*) FROM stepready.tasks WHERE status = 'cancelled'`), "kept forever")
	require.Equal(t, 3, b.count(`SELECT count(*) FROM stepready.tasks WHERE status = 'pending'`))
	require.Equal(t, 25.0, testutil.ToFloat64(mustCounter(t, b, "stepready_pruned_tasks_total")))

	p, err = maintenance.NewTaskPruner(b.env, maintenance.TaskPrunerConfig{RetentionComplete: maintenance.KeepForever,
		RetentionFailed: time.Hour})
	require.NoError(t, err)
	n, err = p.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 5, n)
}
