package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
)

// A diamond runs to completion in dependency order, in both dispatch modes.
func TestDiamondRunsInDependencyOrder(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: time.Minute, ReapInterval: time.Second})
			id := b.createTask(t, `{"name": "diamond", "steps": [
				{"name": "a", "handler": "noop"},
				{"name": "b", "handler": "noop", "depends_on": ["a"]},
				{"name": "c", "handler": "noop", "depends_on": ["a"]},
				{"name": "d", "handler": "noop", "depends_on": ["b", "c"]}]}`)
			b.waitTask(t, id, 20*time.Second, "complete")

			// Every child started after each of its parents completed (event ids are a total order).
			rows, err := b.db.Pool.Query(context.Background(), `
				SELECT p.name, c.name,
				       (SELECT max(id) FROM stepready.step_events WHERE step_id = p.id AND event = 'step.completed'),
				       (SELECT min(id) FROM stepready.step_events WHERE step_id = c.id AND event = 'attempt.started')
				  FROM stepready.step_edges e
				  JOIN stepready.steps p ON p.id = e.parent_step_id
				  JOIN stepready.steps c ON c.id = e.child_step_id
				 WHERE c.task_id = $1`, id)
			require.NoError(t, err)
			n := 0
			for rows.Next() {
				var parent, child string
				var completed, started int64
				require.NoError(t, rows.Scan(&parent, &child, &completed, &started))
				require.Less(t, completed, started, "%s must complete before %s starts", parent, child)
				n++
			}
			require.NoError(t, rows.Err())
			require.Equal(t, 4, n)
		})
	}
}

// Poll-only, each hand-off from a parent to its child takes about one poll interval at most, in both dispatch
// modes: direct dispatch claims the child as soon as the parent's outcome is recorded, and River's producers
// poll for the child's job every poll interval (capped at River's default of a second, which every hand-off
// waited for before: about 1 s each, measured on a 100 ms poll). Median of the hand-offs of three 4-step
// chains, measured on the database's clock; the bound is generous for a loaded machine.
func TestPollOnlyHandOffFollowsThePollInterval(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.start(t, stepready.Config{Dispatch: mode, PollOnly: true, PollInterval: 100 * time.Millisecond})
			var ids []int64
			for range 3 {
				id := b.createTask(t, `{"name": "chain", "steps": [{"name": "s1", "handler": "noop"},
					{"name": "s2", "handler": "noop", "depends_on": ["s1"]},
					{"name": "s3", "handler": "noop", "depends_on": ["s2"]},
					{"name": "s4", "handler": "noop", "depends_on": ["s3"]}]}`)
				b.waitTask(t, id, 30*time.Second, "complete")
				ids = append(ids, id)
			}
			var median time.Duration
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
				SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY c.last_attempted_at - p.completed_at)
				  FROM stepready.steps p
				  JOIN stepready.step_edges e ON e.parent_step_id = p.id
				  JOIN stepready.steps c ON c.id = e.child_step_id
				 WHERE p.task_id = ANY ($1)`, ids).Scan(&median))
			require.Less(t, median, 500*time.Millisecond, "a hand-off waits about one 100 ms poll, not River's 1 s")
		})
	}
}

// --poll-only (PgBouncer transaction pooling): no LISTEN anywhere; the poll interval and the due timer alone
// drive the work.
func TestPollOnlyModeRunsWithoutNotifications(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.start(t, stepready.Config{Dispatch: mode, PollOnly: true, PollInterval: 100 * time.Millisecond,
				ReapInterval: time.Second})
			id := b.createTask(t, `{"name": "chain", "steps": [{"name": "a", "handler": "noop"},
				{"name": "b", "handler": "noop", "depends_on": ["a"]}]}`)
			b.waitTask(t, id, 20*time.Second, "complete")
			var listeners int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = $1 AND query ILIKE 'LISTEN%'`,
				daemonAppName).Scan(&listeners))
			require.Zero(t, listeners, "poll-only mode opens no LISTEN connection")
		})
	}
}
