package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// wantRow is the expected readiness of one step; reason "" means ready.
type wantRow struct {
	state     string
	total     int32
	completed int32
	reason    string
}

// requireReadiness checks every step of a task against want (by step name) and then the pending_parents
// invariant of the claim index.
func (b *schemaBundle) requireReadiness(taskID int64, asOf time.Time, want map[string]wantRow) {
	b.t.Helper()
	got := b.readinessByName(taskID, asOf)
	require.Len(b.t, got, len(want))
	for name, w := range want {
		r, ok := got[name]
		require.Truef(b.t, ok, "no readiness row for step %q", name)
		require.Equalf(b.t, w.state, r.State, "state of %q", name)
		require.Equalf(b.t, w.total, r.TotalParents, "total_parents of %q", name)
		require.Equalf(b.t, w.completed, r.CompletedParents, "completed_parents of %q", name)
		require.Equalf(b.t, w.total == w.completed, r.DependenciesSatisfied, "dependencies_satisfied of %q", name)
		if w.reason == "" {
			require.Truef(b.t, r.Ready, "%q should be ready, blocked by %v", name, r.BlockedReason)
			require.Nilf(b.t, r.BlockedReason, "blocked_reason of ready step %q", name)
		} else {
			require.Falsef(b.t, r.Ready, "%q should not be ready", name)
			require.NotNilf(b.t, r.BlockedReason, "blocked_reason of %q", name)
			require.Equalf(b.t, w.reason, *r.BlockedReason, "blocked_reason of %q", name)
		}
	}
	b.requirePendingParentsInvariant([]int64{taskID}, asOf)
}

func TestStepReadinessParentStates(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	tests := []struct {
		name      string
		satisfies bool
		// move puts the parent in its state.
		move func(b *schemaBundle, parent int64)
	}{
		{"complete", true, func(b *schemaBundle, p int64) { b.setStep(p, `state = 'complete', attempts = 1`) }},
		{"resolved by resolve_step", true, func(b *schemaBundle, p int64) {
			b.exec(`SELECT stepready.resolve_step($1, '{"by": "operator"}', $2)`, p, testBase)
		}},
		{"skipped", true, func(b *schemaBundle, p int64) { b.setStep(p, `state = 'skipped'`) }},
		{"cancelled", false, func(b *schemaBundle, p int64) { b.setStep(p, `state = 'cancelled'`) }},
		{"error", false, func(b *schemaBundle, p int64) { b.setStep(p, `state = 'error', attempts = 3`) }},
		{"pending", false, func(*schemaBundle, int64) {}},
		{"enqueued", false, func(b *schemaBundle, p int64) { b.setStep(p, `state = 'enqueued'`) }},
		{"in_progress", false, func(b *schemaBundle, p int64) { b.setStep(p, `state = 'in_progress', attempts = 1`) }},
		{"waiting_for_retry", false, func(b *schemaBundle, p int64) {
			b.setStep(p, `state = 'waiting_for_retry', attempts = 1`)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			taskID := b.createTask(`{"name": "pair", "steps": [
				{"name": "parent", "handler": "noop"},
				{"name": "child", "handler": "noop", "depends_on": ["parent"]},
				{"name": "bystander", "handler": "noop"}]}`)
			ids := b.stepIDs(taskID)
			tt.move(b, ids["parent"])

			child := b.stepReadiness(taskID, ids["child"], testBase)
			require.Equal(t, int32(1), child.TotalParents)
			require.Equal(t, tt.satisfies, child.DependenciesSatisfied)
			if tt.satisfies {
				require.Equal(t, int32(1), child.CompletedParents)
				require.True(t, child.Ready)
				require.Nil(t, child.BlockedReason)
			} else {
				require.Equal(t, int32(0), child.CompletedParents)
				require.False(t, child.Ready)
				require.NotNil(t, child.BlockedReason)
				if tt.name == "error" {
					// The task is in error, which is reported first; once it is active again the unsatisfied
					// dependency shows.
					require.Equal(t, "task_not_active", *child.BlockedReason)
					b.setTask(taskID, `status = 'in_progress'`)
					child = b.stepReadiness(taskID, ids["child"], testBase)
				}
				require.Equal(t, "waiting_for_dependencies", *child.BlockedReason)
			}
			b.requirePendingParentsInvariant([]int64{taskID}, testBase)
		})
	}
}

func TestStepReadinessLinear(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	taskID := b.createTask(`{"name": "linear", "steps": [
		{"name": "a", "handler": "noop"},
		{"name": "b", "handler": "noop", "depends_on": ["a"]},
		{"name": "c", "handler": "noop", "depends_on": ["b"]}]}`)
	ids := b.stepIDs(taskID)

	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"a": {"pending", 0, 0, ""},
		"b": {"pending", 1, 0, "waiting_for_dependencies"},
		"c": {"pending", 1, 0, "waiting_for_dependencies"},
	})

	b.setStep(ids["a"], `state = 'complete', attempts = 1`)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"a": {"complete", 0, 0, "terminal"},
		"b": {"pending", 1, 1, ""},
		"c": {"pending", 1, 0, "waiting_for_dependencies"},
	})

	b.exec(`SELECT stepready.resolve_step($1, '{}', $2)`, ids["b"], testBase)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"a": {"complete", 0, 0, "terminal"},
		"b": {"resolved_manually", 1, 1, "terminal"},
		"c": {"pending", 1, 1, ""},
	})

	b.setStep(ids["c"], `state = 'skipped'`)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"a": {"complete", 0, 0, "task_not_active"},
		"b": {"resolved_manually", 1, 1, "task_not_active"},
		"c": {"skipped", 1, 1, "task_not_active"},
	})
}

func TestStepReadinessDiamond(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	taskID := b.createTask(`{"name": "diamond", "steps": [
		{"name": "a", "handler": "noop"},
		{"name": "b", "handler": "noop", "depends_on": ["a"]},
		{"name": "c", "handler": "noop", "depends_on": ["a"]},
		{"name": "d", "handler": "noop", "depends_on": ["b", "c"]}]}`)
	ids := b.stepIDs(taskID)

	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"a": {"pending", 0, 0, ""},
		"b": {"pending", 1, 0, "waiting_for_dependencies"},
		"c": {"pending", 1, 0, "waiting_for_dependencies"},
		"d": {"pending", 2, 0, "waiting_for_dependencies"},
	})

	b.setStep(ids["a"], `state = 'complete', attempts = 1`)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"a": {"complete", 0, 0, "terminal"},
		"b": {"pending", 1, 1, ""},
		"c": {"pending", 1, 1, ""},
		"d": {"pending", 2, 0, "waiting_for_dependencies"},
	})

	b.setStep(ids["b"], `state = 'complete', attempts = 1`)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"a": {"complete", 0, 0, "terminal"},
		"b": {"complete", 1, 1, "terminal"},
		"c": {"pending", 1, 1, ""},
		"d": {"pending", 2, 1, "waiting_for_dependencies"},
	})

	b.setStep(ids["c"], `state = 'skipped'`)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"a": {"complete", 0, 0, "terminal"},
		"b": {"complete", 1, 1, "terminal"},
		"c": {"skipped", 1, 1, "terminal"},
		"d": {"pending", 2, 2, ""},
	})

	// reset_task puts the skipped step back to pending: d loses a satisfied parent again.
	b.exec(`SELECT stepready.reset_task($1, $2)`, taskID, testBase)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"a": {"complete", 0, 0, "terminal"},
		"b": {"complete", 1, 1, "terminal"},
		"c": {"pending", 1, 1, ""},
		"d": {"pending", 2, 1, "waiting_for_dependencies"},
	})

	// A cancelled parent does not satisfy: d keeps waiting.
	b.setStep(ids["c"], `state = 'cancelled'`)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"a": {"complete", 0, 0, "terminal"},
		"b": {"complete", 1, 1, "terminal"},
		"c": {"cancelled", 1, 1, "terminal"},
		"d": {"pending", 2, 1, "waiting_for_dependencies"},
	})
}

func TestStepReadinessTree(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	taskID := b.createTask(`{"name": "tree", "steps": [
		{"name": "root", "handler": "noop"},
		{"name": "l", "handler": "noop", "depends_on": ["root"]},
		{"name": "r", "handler": "noop", "depends_on": ["root"]},
		{"name": "l1", "handler": "noop", "depends_on": ["l"]},
		{"name": "l2", "handler": "noop", "depends_on": ["l"]},
		{"name": "r1", "handler": "noop", "depends_on": ["r"]}]}`)
	ids := b.stepIDs(taskID)

	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"root": {"pending", 0, 0, ""},
		"l":    {"pending", 1, 0, "waiting_for_dependencies"},
		"r":    {"pending", 1, 0, "waiting_for_dependencies"},
		"l1":   {"pending", 1, 0, "waiting_for_dependencies"},
		"l2":   {"pending", 1, 0, "waiting_for_dependencies"},
		"r1":   {"pending", 1, 0, "waiting_for_dependencies"},
	})

	b.setStep(ids["root"], `state = 'complete', attempts = 1`)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"root": {"complete", 0, 0, "terminal"},
		"l":    {"pending", 1, 1, ""},
		"r":    {"pending", 1, 1, ""},
		"l1":   {"pending", 1, 0, "waiting_for_dependencies"},
		"l2":   {"pending", 1, 0, "waiting_for_dependencies"},
		"r1":   {"pending", 1, 0, "waiting_for_dependencies"},
	})

	b.exec(`SELECT stepready.resolve_step($1, '{"manual": true}', $2)`, ids["l"], testBase)
	b.setStep(ids["r"], `state = 'cancelled'`)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"root": {"complete", 0, 0, "terminal"},
		"l":    {"resolved_manually", 1, 1, "terminal"},
		"r":    {"cancelled", 1, 1, "terminal"},
		"l1":   {"pending", 1, 1, ""},
		"l2":   {"pending", 1, 1, ""},
		"r1":   {"pending", 1, 0, "waiting_for_dependencies"},
	})

	// A step in error does not satisfy either (the task is in error, so every step reports that first).
	b.setStep(ids["l1"], `state = 'error', attempts = 3`)
	b.requireReadiness(taskID, testBase, map[string]wantRow{
		"root": {"complete", 0, 0, "task_not_active"},
		"l":    {"resolved_manually", 1, 1, "task_not_active"},
		"r":    {"cancelled", 1, 1, "task_not_active"},
		"l1":   {"error", 1, 1, "task_not_active"},
		"l2":   {"pending", 1, 1, "task_not_active"},
		"r1":   {"pending", 1, 0, "task_not_active"},
	})
}

func TestStepReadinessBackoffBoundary(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	tests := []struct {
		name   string
		offset time.Duration // next_attempt_at - as_of
		reason string
	}{
		{"due 1 µs ago", -tick, ""},
		{"due exactly now", 0, ""},
		{"due in 1 µs", tick, "backoff"},
	}
	for _, state := range []struct{ state, set string }{
		{"pending", `state = 'pending', attempts = 0`},
		{"waiting_for_retry", `state = 'waiting_for_retry', attempts = 1`},
	} {
		for _, tt := range tests {
			t.Run(state.state+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				b := b.on(t)
				taskID := b.insertTask("backoff")
				stepID := b.insertStep(taskID, "s")
				asOf := testBase.Add(time.Hour)
				b.setStep(stepID, state.set+`, next_attempt_at = $2`, asOf.Add(tt.offset))

				r := b.stepReadiness(taskID, stepID, asOf)
				requireTimeIs(t, asOf.Add(tt.offset), r.NextAttemptAt)
				require.True(t, r.RetryEligible)
				if tt.reason == "" {
					require.True(t, r.Ready)
					require.Nil(t, r.BlockedReason)
				} else {
					require.False(t, r.Ready)
					require.NotNil(t, r.BlockedReason)
					require.Equal(t, tt.reason, *r.BlockedReason)
				}
			})
		}
	}
}

func TestStepReadinessFilterReadsParentsFromTheTable(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	taskID := b.createTask(`{"name": "filter", "steps": [
		{"name": "a", "handler": "noop"},
		{"name": "b", "handler": "noop", "depends_on": ["a"]},
		{"name": "c", "handler": "noop", "depends_on": ["b", "a"]}]}`)
	otherID := b.createTask(`{"name": "other", "steps": [{"name": "x", "handler": "noop"}]}`)
	ids := b.stepIDs(taskID)

	// Only a is complete: c sees a complete and b not.
	b.setStep(ids["a"], `state = 'complete', attempts = 1`)
	rows := b.readiness([]int64{taskID}, []int64{ids["c"]}, testBase)
	require.Len(t, rows, 1)
	require.Equal(t, ids["c"], rows[0].StepID)
	require.Equal(t, int32(2), rows[0].TotalParents)
	require.Equal(t, int32(1), rows[0].CompletedParents)
	require.False(t, rows[0].Ready)

	// Both complete: c alone in the filter still sees both parents complete.
	b.setStep(ids["b"], `state = 'complete', attempts = 1`)
	rows = b.readiness([]int64{taskID}, []int64{ids["c"]}, testBase)
	require.Len(t, rows, 1)
	require.Equal(t, int32(2), rows[0].TotalParents)
	require.Equal(t, int32(2), rows[0].CompletedParents)
	require.True(t, rows[0].DependenciesSatisfied)
	require.True(t, rows[0].Ready)

	// A filtered step of a task that is not asked for is not returned; the filter keeps the step order.
	xID := b.stepIDs(otherID)["x"]
	rows = b.readiness([]int64{taskID}, []int64{xID, ids["c"], ids["a"]}, testBase)
	require.Len(t, rows, 2)
	require.Equal(t, []int64{ids["a"], ids["c"]}, []int64{rows[0].StepID, rows[1].StepID})
}

func TestStepReadinessBlockedReasons(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	tests := []struct {
		name string
		// parent adds a pending (unsatisfied) parent to the step.
		parent bool
		// stepSet is applied to the step (after the edge), taskSet to the task afterwards.
		stepSet string
		taskSet string
		reason  string // "" = ready
	}{
		{name: "ready", reason: ""},
		{name: "ready first attempt whatever max_attempts and retryable say",
			stepSet: `max_attempts = 0, retryable = false`, reason: ""},
		{name: "ready retry with attempts left",
			stepSet: `state = 'waiting_for_retry', attempts = 2, max_attempts = 3`, reason: ""},

		// One reason each.
		{name: "task_not_active: task complete", taskSet: `status = 'complete'`, reason: "task_not_active"},
		{name: "task_not_active: task error", taskSet: `status = 'error'`, reason: "task_not_active"},
		{name: "task_not_active: task cancelled", taskSet: `status = 'cancelled'`, reason: "task_not_active"},
		{name: "task active: task in_progress", taskSet: `status = 'in_progress'`, reason: ""},
		{name: "task_paused", taskSet: `paused = true`, reason: "task_paused"},
		{name: "terminal: complete", stepSet: `state = 'complete', attempts = 1`, reason: "terminal"},
		{name: "terminal: error", stepSet: `state = 'error', attempts = 1`, taskSet: `status = 'in_progress'`,
			reason: "terminal"},
		{name: "terminal: skipped", stepSet: `state = 'skipped'`, reason: "terminal"},
		{name: "terminal: cancelled", stepSet: `state = 'cancelled'`, reason: "terminal"},
		{name: "terminal: resolved_manually", stepSet: `state = 'resolved_manually'`, reason: "terminal"},
		{name: "in_flight: enqueued", stepSet: `state = 'enqueued'`, reason: "in_flight"},
		{name: "in_flight: in_progress", stepSet: `state = 'in_progress', attempts = 1`, reason: "in_flight"},
		{name: "waiting_for_dependencies", parent: true, reason: "waiting_for_dependencies"},
		{name: "not_retryable", stepSet: `state = 'waiting_for_retry', attempts = 1, max_attempts = 3,
			retryable = false`, reason: "not_retryable"},
		{name: "retries_exhausted", stepSet: `state = 'waiting_for_retry', attempts = 3, max_attempts = 3`,
			reason: "retries_exhausted"},
		{name: "retries_exhausted: max_attempts 0", stepSet: `state = 'waiting_for_retry', attempts = 1,
			max_attempts = 0`, reason: "retries_exhausted"},
		{name: "backoff", stepSet: `state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2`,
			reason: "backoff"},

		// Precedence: two reasons apply, the first in the documented order wins.
		{name: "task_not_active before task_paused", taskSet: `status = 'cancelled', paused = true`,
			reason: "task_not_active"},
		{name: "task_paused before terminal", stepSet: `state = 'complete', attempts = 1`, taskSet: `paused = true`,
			reason: "task_paused"},
		{name: "task_paused before in_flight", stepSet: `state = 'in_progress', attempts = 1`,
			taskSet: `paused = true`, reason: "task_paused"},
		{name: "task_paused before waiting_for_dependencies", parent: true, taskSet: `paused = true`,
			reason: "task_paused"},
		{name: "task_paused before backoff", stepSet: `state = 'waiting_for_retry', attempts = 1,
			next_attempt_at = $2`, taskSet: `paused = true`, reason: "task_paused"},
		{name: "terminal before waiting_for_dependencies", parent: true, stepSet: `state = 'complete', attempts = 1`,
			reason: "terminal"},
		{name: "terminal before retries_exhausted", stepSet: `state = 'complete', attempts = 3, max_attempts = 3`,
			reason: "terminal"},
		{name: "in_flight before waiting_for_dependencies", parent: true, stepSet: `state = 'enqueued'`,
			reason: "in_flight"},
		{name: "in_flight before retries_exhausted", stepSet: `state = 'in_progress', attempts = 3, max_attempts = 3`,
			reason: "in_flight"},
		{name: "in_flight before not_retryable", stepSet: `state = 'in_progress', attempts = 1, retryable = false`,
			reason: "in_flight"},
		{name: "waiting_for_dependencies before not_retryable", parent: true, stepSet: `state = 'waiting_for_retry',
			attempts = 1, retryable = false`, reason: "waiting_for_dependencies"},
		{name: "waiting_for_dependencies before retries_exhausted", parent: true, stepSet: `state =
			'waiting_for_retry', attempts = 3, max_attempts = 3`, reason: "waiting_for_dependencies"},
		{name: "waiting_for_dependencies before backoff", parent: true, stepSet: `next_attempt_at = $2`,
			reason: "waiting_for_dependencies"},
		{name: "not_retryable before retries_exhausted", stepSet: `state = 'waiting_for_retry', attempts = 3,
			max_attempts = 3, retryable = false`, reason: "not_retryable"},
		{name: "not_retryable before backoff", stepSet: `state = 'waiting_for_retry', attempts = 1, retryable = false,
			next_attempt_at = $2`, reason: "not_retryable"},
		{name: "retries_exhausted before backoff", stepSet: `state = 'waiting_for_retry', attempts = 3,
			max_attempts = 3, next_attempt_at = $2`, reason: "retries_exhausted"},
	}
	asOf := testBase
	future := asOf.Add(time.Second)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			taskID := b.insertTask("reasons")
			stepID := b.insertStep(taskID, "s")
			// A pending bystander keeps the task active whatever happens to s.
			b.insertStep(taskID, "bystander")
			if tt.parent {
				b.insertEdge(b.insertStep(taskID, "parent"), stepID)
			}
			if tt.stepSet != "" {
				var args []any
				if strings.Contains(tt.stepSet, "$2") {
					args = append(args, future)
				}
				b.setStep(stepID, tt.stepSet, args...)
			}
			if tt.taskSet != "" {
				b.setTask(taskID, tt.taskSet)
			}

			r := b.stepReadiness(taskID, stepID, asOf)
			if tt.reason == "" {
				require.Nil(t, r.BlockedReason)
				require.True(t, r.Ready)
			} else {
				require.NotNil(t, r.BlockedReason, "ready, expected %s", tt.reason)
				require.Equal(t, tt.reason, *r.BlockedReason)
				require.False(t, r.Ready)
			}
			require.Equal(t, !tt.parent, r.DependenciesSatisfied)
			b.requirePendingParentsInvariant([]int64{taskID}, asOf)
		})
	}
}

func TestStepReadinessRetryEligibleColumn(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	taskID := b.insertTask("eligible")
	fresh := b.insertStep(taskID, "fresh")
	left := b.insertStep(taskID, "left")
	spent := b.insertStep(taskID, "spent")
	b.setStep(left, `state = 'waiting_for_retry', attempts = 2, max_attempts = 3, retryable = true`)
	b.setStep(spent, `state = 'waiting_for_retry', attempts = 3, max_attempts = 3, retryable = true`)

	got := b.readinessByName(taskID, testBase)
	require.True(t, got["fresh"].RetryEligible)
	require.Equal(t, int32(0), got["fresh"].Attempts)
	require.Equal(t, ptr[int32](3), got["fresh"].MaxAttempts, "standard preset")
	require.Equal(t, ptr(true), got["fresh"].Retryable)
	require.True(t, got["left"].RetryEligible)
	require.Equal(t, int32(2), got["left"].Attempts)
	require.False(t, got["spent"].RetryEligible)
	require.Equal(t, int32(3), got["spent"].Attempts)
	require.Equal(t, fresh, got["fresh"].StepID)
	require.Equal(t, taskID, got["fresh"].TaskID)
}

func TestStepReadinessColumns(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	taskID := b.createTask(`{"name": "cols", "steps": [{"name": "a", "handler": "noop"}]}`)

	require.Equal(t, readinessColumns,
		b.columnNames(`SELECT * FROM stepready.step_readiness($1::bigint[], NULL, $2)`, []int64{taskID}, testBase))
	// The documented defaults: p_step_ids NULL and p_as_of now().
	require.Equal(t, readinessColumns,
		b.columnNames(`SELECT * FROM stepready.step_readiness(ARRAY[$1::bigint])`, taskID))
	require.Len(t, b.readiness([]int64{taskID}, nil, testBase), 1)
}

func TestStepReadinessSeveralTasksOrderedByTaskThenStep(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	t1 := b.insertTask("first")
	z := b.insertStep(t1, "z")
	a := b.insertStep(t1, "a")
	t2 := b.insertTask("second")
	m := b.insertStep(t2, "m")
	t3 := b.insertTask("not asked")
	b.insertStep(t3, "n")
	late := b.insertStep(t1, "late") // a higher id than every step of t2

	rows := b.readiness([]int64{t2, t1}, nil, testBase)
	var got [][2]int64
	for _, r := range rows {
		got = append(got, [2]int64{r.TaskID, r.StepID})
	}
	require.Equal(t, [][2]int64{{t1, z}, {t1, a}, {t1, late}, {t2, m}}, got)

	require.Empty(t, b.readiness([]int64{}, nil, testBase))
	require.Empty(t, b.readiness([]int64{t3 + 1000}, nil, testBase))
}
