package readmodel_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/readmodel"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// mapTask creates a task whose map step "m" over n elements has fanned out, its first element complete and its
// second in progress; it returns the task and the map step.
func mapTask(t *testing.T, db *pgtest.DB, n int) (taskID, mapID int64) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task(jsonb_build_object('name', 'fan',
		'steps', jsonb_build_array(jsonb_build_object('name', 'm', 'handler', 'work',
			'map', jsonb_build_object('over', (SELECT jsonb_agg(g) FROM generate_series(1, $1::int) g))))))`, n).
		Scan(&taskID))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT id FROM stepready.steps WHERE task_id = $1 AND name = 'm'`,
		taskID).Scan(&mapID))
	exec(t, db, `SELECT count(*) FROM stepready.claim_and_start_steps(10, 'w', 60000)`) // fans out
	exec(t, db, `SELECT count(*) FROM stepready.claim_and_start_steps(2, 'w', 60000)`)
	exec(t, db, `SELECT stepready.complete_step(id, 1, '{"out": 1}') FROM stepready.steps
		WHERE map_step_id = $1 AND element_index = 0`, mapID)
	return taskID, mapID
}

// A map step's counts reach the read model's steps; its page of elements is in element order, keyset on the
// index, in the snapshot of the rest of the step.
func TestReadStepPageElements(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	taskID, mapID := mapTask(t, db, 7)

	d, err := readmodel.ReadTask(t.Context(), db.Pool, taskID, readmodel.TaskOptions{})
	require.NoError(t, err)
	require.Len(t, d.StepList, 8)
	require.Equal(t, &readmodel.MapProgress{FannedOut: true, Total: 7, Done: 1, InFlight: 1}, d.StepList[0].Map)
	require.Nil(t, d.StepList[0].MapStepID)
	require.Equal(t, mapID, *d.StepList[3].MapStepID)
	require.Equal(t, int32(2), *d.StepList[3].ElementIndex)

	s, err := readmodel.ReadStepPage(t.Context(), db.Pool, taskID, mapID, readmodel.StepOptions{ElementsAfter: -1,
		ElementsLimit: 3})
	require.NoError(t, err)
	require.True(t, s.MoreElements)
	require.Equal(t, []string{"m[0]", "m[1]", "m[2]"}, elementNames(s.Elements))
	require.Equal(t, "complete", s.Elements[0].State)
	require.JSONEq(t, `{"out": 1}`, string(s.Elements[0].Output))
	require.Equal(t, "in_progress", s.Elements[1].State)

	s, err = readmodel.ReadStepPage(t.Context(), db.Pool, taskID, mapID, readmodel.StepOptions{ElementsAfter: 5,
		ElementsLimit: 3})
	require.NoError(t, err)
	require.False(t, s.MoreElements)
	require.Equal(t, []string{"m[6]"}, elementNames(s.Elements))

	// ReadStep: the first page; an element or an ordinary step has none.
	s, err = readmodel.ReadStep(t.Context(), db.Pool, taskID, mapID, nil)
	require.NoError(t, err)
	require.Len(t, s.Elements, 7)
	s, err = readmodel.ReadStep(t.Context(), db.Pool, taskID, s.Elements[1].ID, nil)
	require.NoError(t, err)
	require.Nil(t, s.Elements)
	require.Equal(t, int32(1), *s.ElementIndex)
}

func elementNames(es []readmodel.Element) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Name
	}
	return out
}
