package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stepSpec is one step of a plain-SQL fixture task: its parents (by name) and a SET list that puts it in its
// state ($2 is bound to the fixture's "future" timestamp when the list uses it).
type stepSpec struct {
	name    string
	parents []string
	set     string
}

// taskWith inserts a task and its steps and edges with plain SQL, then moves every step with its SET list, in
// order. It returns the task id and the step ids by name.
func (b *schemaBundle) taskWith(future time.Time, steps ...stepSpec) (int64, map[string]int64) {
	b.t.Helper()
	taskID := b.insertTask("fixture")
	ids := map[string]int64{}
	for _, s := range steps {
		ids[s.name] = b.insertStep(taskID, s.name)
	}
	for _, s := range steps {
		for _, p := range s.parents {
			b.insertEdge(ids[p], ids[s.name])
		}
	}
	for _, s := range steps {
		if s.set == "" {
			continue
		}
		var args []any
		if strings.Contains(s.set, "$2") {
			args = append(args, future)
		}
		b.setStep(ids[s.name], s.set, args...)
	}
	return taskID, ids
}

func TestTaskExecutionContextStatuses(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	asOf := testBase
	future := asOf.Add(10 * time.Second)

	const (
		complete = `state = 'complete', attempts = 1`
		running  = `state = 'in_progress', attempts = 1`
		failed   = `state = 'error', attempts = 3`
		backoff  = `state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2`
	)
	tests := []struct {
		name  string
		steps []stepSpec
		// after runs operator functions or forces rows once the steps are in place.
		after func(b *schemaBundle, taskID int64, ids map[string]int64)
		want  string
	}{
		{name: "cancelled", steps: []stepSpec{{name: "a"}},
			after: func(b *schemaBundle, id int64, _ map[string]int64) {
				b.exec(`SELECT stepready.cancel_task($1, 'test', $2)`, id, asOf)
			}, want: "cancelled"},
		{name: "cancelled before paused", steps: []stepSpec{{name: "a"}},
			after: func(b *schemaBundle, id int64, _ map[string]int64) {
				b.exec(`SELECT stepready.pause_task($1, $2)`, id, asOf)
				b.exec(`SELECT stepready.cancel_task($1, 'test', $2)`, id, asOf)
			}, want: "cancelled"},
		{name: "cancelled before blocked_by_failures", steps: []stepSpec{{name: "a", set: failed}, {name: "b"}},
			after: func(b *schemaBundle, id int64, _ map[string]int64) {
				b.exec(`SELECT stepready.cancel_task($1, 'test', $2)`, id, asOf)
			}, want: "cancelled"},
		{name: "paused", steps: []stepSpec{{name: "a"}},
			after: func(b *schemaBundle, id int64, _ map[string]int64) {
				b.exec(`SELECT stepready.pause_task($1, $2)`, id, asOf)
			}, want: "paused"},
		{name: "paused before blocked_by_failures", steps: []stepSpec{{name: "a", set: failed}, {name: "b"}},
			after: func(b *schemaBundle, id int64, _ map[string]int64) {
				b.exec(`SELECT stepready.pause_task($1, $2)`, id, asOf)
			}, want: "paused"},
		{name: "blocked_by_failures", steps: []stepSpec{{name: "a", set: failed}, {name: "b", parents: []string{"a"}}},
			want: "blocked_by_failures"},
		{name: "blocked_by_failures before has_ready_steps",
			steps: []stepSpec{{name: "a", set: failed}, {name: "b"}},
			// Forced: the task row says active, so b is ready while a step is in error.
			after: func(b *schemaBundle, id int64, _ map[string]int64) { b.setTask(id, `status = 'in_progress'`) },
			want:  "blocked_by_failures"},
		{name: "has_ready_steps", steps: []stepSpec{{name: "a"}, {name: "b", parents: []string{"a"}}},
			want: "has_ready_steps"},
		{name: "has_ready_steps before processing", steps: []stepSpec{{name: "a", set: running}, {name: "b"}},
			want: "has_ready_steps"},
		{name: "has_ready_steps: backoff due exactly now",
			steps: []stepSpec{{name: "a", set: `state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2`}},
			after: func(b *schemaBundle, _ int64, ids map[string]int64) {
				b.setStep(ids["a"], `next_attempt_at = $2`, asOf)
			}, want: "has_ready_steps"},
		{name: "processing", steps: []stepSpec{{name: "a", set: running}, {name: "b", parents: []string{"a"}}},
			want: "processing"},
		{name: "processing: enqueued", steps: []stepSpec{{name: "a", set: `state = 'enqueued'`}},
			want: "processing"},
		{name: "processing before waiting_for_retry",
			steps: []stepSpec{{name: "a", set: `state = 'enqueued'`}, {name: "b", set: backoff}},
			want:  "processing"},
		{name: "all_complete", steps: []stepSpec{{name: "a", set: complete}, {name: "b", parents: []string{"a"},
			set: complete}}, want: "all_complete"},
		{name: "all_complete with resolved and skipped steps",
			steps: []stepSpec{{name: "a", set: complete}, {name: "b", set: `state = 'skipped'`},
				{name: "c", parents: []string{"a", "b"}}},
			after: func(b *schemaBundle, _ int64, ids map[string]int64) {
				b.exec(`SELECT stepready.resolve_step($1, '{}', $2)`, ids["c"], asOf)
			}, want: "all_complete"},
		{name: "waiting_for_retry", steps: []stepSpec{{name: "a", set: backoff}}, want: "waiting_for_retry"},
		{name: "waiting_for_retry: backoff due in 1 µs",
			steps: []stepSpec{{name: "a", set: `state = 'waiting_for_retry', attempts = 1`}},
			after: func(b *schemaBundle, _ int64, ids map[string]int64) {
				b.setStep(ids["a"], `next_attempt_at = $2`, asOf.Add(tick))
			}, want: "waiting_for_retry"},
		{name: "waiting_for_retry: delayed first attempt",
			steps: []stepSpec{{name: "a", set: `next_attempt_at = $2`}}, want: "waiting_for_retry"},
		{name: "waiting_for_retry before waiting_for_dependencies",
			steps: []stepSpec{{name: "a", set: backoff}, {name: "b", parents: []string{"a"}}},
			want:  "waiting_for_retry"},
		{name: "waiting_for_dependencies: cancelled parent",
			steps: []stepSpec{{name: "a", set: `state = 'cancelled'`}, {name: "b", parents: []string{"a"}}},
			want:  "waiting_for_dependencies"},
		{name: "waiting_for_dependencies: no step at all is not all_complete", want: "waiting_for_dependencies"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			taskID, ids := b.taskWith(future, tt.steps...)
			if tt.after != nil {
				tt.after(b, taskID, ids)
			}
			got := b.execContext(taskID, asOf)
			require.Equal(t, taskID, got.TaskID)
			require.Equal(t, tt.want, got.ExecutionStatus, "%+v", got)
		})
	}
}

func TestTaskExecutionContextCounts(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	asOf := testBase
	future := asOf.Add(time.Minute)

	taskID, _ := b.taskWith(future,
		stepSpec{name: "pending"},
		stepSpec{name: "pending_child", parents: []string{"waiting"}},
		stepSpec{name: "enqueued", set: `state = 'enqueued'`},
		stepSpec{name: "in_progress", set: `state = 'in_progress', attempts = 1`},
		stepSpec{name: "waiting", set: `state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2`},
		stepSpec{name: "complete", set: `state = 'complete', attempts = 1`},
		stepSpec{name: "resolved", set: `state = 'resolved_manually'`},
		stepSpec{name: "error1", set: `state = 'error', attempts = 3`},
		stepSpec{name: "error2", set: `state = 'error', attempts = 1`},
		stepSpec{name: "skipped", set: `state = 'skipped'`},
		stepSpec{name: "cancelled1", set: `state = 'cancelled'`},
		stepSpec{name: "cancelled2", set: `state = 'cancelled'`},
		stepSpec{name: "cancelled3", set: `state = 'cancelled'`},
	)

	got := b.execContext(taskID, asOf)
	require.Equal(t, taskID, got.TaskID)
	require.Equal(t, "error", got.Status)
	require.Equal(t, "blocked_by_failures", got.ExecutionStatus)
	require.Equal(t, int32(13), got.TotalSteps)
	require.Equal(t, int32(2), got.PendingSteps)
	require.Equal(t, int32(2), got.InFlightSteps)
	require.Equal(t, int32(1), got.WaitingForRetrySteps)
	require.Equal(t, int32(2), got.CompletedSteps, "complete and resolved_manually")
	require.Equal(t, int32(2), got.ErrorSteps)
	require.Equal(t, int32(1), got.SkippedSteps)
	require.Equal(t, int32(3), got.CancelledSteps)
	require.Equal(t, int32(0), got.ReadySteps, "nothing is ready in a task in error")
	requireTimeIs(t, future, got.NextAttemptAt)
	require.Equal(t, got.TotalSteps, got.PendingSteps+got.InFlightSteps+got.WaitingForRetrySteps+got.CompletedSteps+
		got.ErrorSteps+got.SkippedSteps+got.CancelledSteps, "every step is counted in exactly one state column")
}

func TestTaskExecutionContextReadyStepsAndNextAttemptAt(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	asOf := testBase.Add(time.Hour)

	taskID, ids := b.taskWith(asOf,
		stepSpec{name: "fresh"},
		stepSpec{name: "due", set: `state = 'waiting_for_retry', attempts = 1`},
		stepSpec{name: "due_now", set: `state = 'waiting_for_retry', attempts = 1`},
		stepSpec{name: "in5s", set: `state = 'waiting_for_retry', attempts = 1`},
		stepSpec{name: "in2s", set: `state = 'waiting_for_retry', attempts = 2`},
		stepSpec{name: "first_in3s"},
		stepSpec{name: "done", set: `state = 'complete', attempts = 1`},
		stepSpec{name: "exhausted", set: `state = 'waiting_for_retry', attempts = 3, max_attempts = 3`},
	)
	b.setStep(ids["due"], `next_attempt_at = $2`, asOf.Add(-time.Second))
	b.setStep(ids["due_now"], `next_attempt_at = $2`, asOf)
	b.setStep(ids["in5s"], `next_attempt_at = $2`, asOf.Add(5*time.Second))
	b.setStep(ids["in2s"], `next_attempt_at = $2`, asOf.Add(2*time.Second))
	b.setStep(ids["first_in3s"], `next_attempt_at = $2`, asOf.Add(3*time.Second))
	// A leftover timestamp on a finished step is not a wake-up time.
	b.setStep(ids["done"], `next_attempt_at = $2`, asOf.Add(time.Second))

	got := b.execContext(taskID, asOf)
	require.Equal(t, int32(8), got.TotalSteps)
	require.Equal(t, int32(3), got.ReadySteps, "fresh, due, due_now")
	require.Equal(t, int32(2), got.PendingSteps)
	require.Equal(t, int32(5), got.WaitingForRetrySteps)
	require.Equal(t, int32(1), got.CompletedSteps)
	require.Equal(t, int32(0), got.InFlightSteps)
	require.Equal(t, int32(0), got.ErrorSteps)
	require.Equal(t, int32(0), got.SkippedSteps)
	require.Equal(t, int32(0), got.CancelledSteps)
	require.Equal(t, "pending", got.Status)
	require.Equal(t, "has_ready_steps", got.ExecutionStatus)
	requireTimeIs(t, asOf.Add(2*time.Second), got.NextAttemptAt, "the earliest future next_attempt_at")

	// 2 s later in2s is due (not future any more): the next one is first_in3s.
	later := b.execContext(taskID, asOf.Add(2*time.Second))
	require.Equal(t, int32(4), later.ReadySteps)
	requireTimeIs(t, asOf.Add(3*time.Second), later.NextAttemptAt)

	// Past every wake-up: no future next_attempt_at.
	end := b.execContext(taskID, asOf.Add(time.Minute))
	require.Nil(t, end.NextAttemptAt)
	require.Equal(t, int32(6), end.ReadySteps)
}

func TestTaskExecutionContextColumns(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	taskID := b.createTask(`{"name": "cols", "steps": [{"name": "a", "handler": "noop"}]}`)

	require.Equal(t, execContextColumns,
		b.columnNames(`SELECT * FROM stepready.task_execution_context($1, $2)`, taskID, testBase))
	require.Equal(t, execContextColumns,
		b.columnNames(`SELECT * FROM stepready.task_execution_context($1)`, taskID), "p_as_of defaults to now()")
	got := b.execContext(taskID, testBase)
	require.Equal(t, "pending", got.Status)
	require.Equal(t, int32(1), got.TotalSteps)
	require.Equal(t, int32(1), got.ReadySteps)
	require.Nil(t, got.NextAttemptAt)
}

func TestTaskExecutionContextUnknownTaskHasNoRow(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	taskID := b.createTask(`{"name": "gone", "steps": [{"name": "a", "handler": "noop"}]}`)
	b.exec(`DELETE FROM stepready.tasks WHERE id = $1`, taskID)

	require.Empty(t, b.execContexts(taskID, testBase), "deleted task")
	require.Empty(t, b.execContexts(taskID+1000, testBase), "never existed")
	require.Empty(t, b.execContexts(-1, testBase))
}
