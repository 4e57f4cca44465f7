package integration

// One list of readiness reasons and one of execution statuses (issue 26), kept in SQL:
// stepready.readiness_reasons() and stepready.execution_statuses(). The tests here hold step_readiness, explain
// and task_execution_context to those lists: a step (a task) is put in a state where every reason (status) of the
// list applies at once, then the reasons are lifted one by one from the top; at each stage the first reason
// reported must be the next one of the list. Any other order in the functions' CASEs fails here.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// listNames returns a list function's names in rank order, checking that the ranks are 1, 2, 3…
func listNames(t *testing.T, b *schemaBundle, query string) []string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), query)
	require.NoError(t, err)
	type item struct {
		Rank int32
		Name string
	}
	items, err := pgx.CollectRows(rows, pgx.RowToStructByPos[item])
	require.NoError(t, err)
	names := make([]string, len(items))
	for i, it := range items {
		require.Equal(t, int32(i+1), it.Rank, query)
		names[i] = it.Name
	}
	return names
}

func TestReadinessReasonsPrecedence(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	at := testBase
	reasons := listNames(t, b, `SELECT rank, reason FROM stepready.readiness_reasons() ORDER BY rank`)
	rank := map[string]int32{}
	for i, r := range reasons {
		rank[r] = int32(i + 1)
	}

	// s waits for p and has a concurrency key whose one slot a step of another task holds, and a rate key whose
	// bucket is empty for an hour.
	task := b.createTask(`{"name": "reasons", "steps": [
		{"name": "p", "handler": "noop"},
		{"name": "s", "handler": "noop", "depends_on": ["p"],
		 "concurrency": {"key": "k", "limit": 1}, "rate_limit": {"key": "r", "limit": 1, "period_ms": 3600000}}]}`)
	ids := b.stepIDs(task)
	holderTask := b.createTask(`{"name": "holder", "steps": [
		{"name": "h", "handler": "noop", "concurrency": {"key": "k", "limit": 1}}]}`)
	holder := b.stepIDs(holderTask)["h"]
	b.setStep(holder, `state = 'in_progress', attempts = 1, lease_owner = 'w', lease_expires_at = $2`, at.Add(time.Hour))
	b.exec(`INSERT INTO stepready.flow_state (key, rate_tat) VALUES ('r', $1)`, at.Add(time.Hour))

	stages := []struct {
		want string
		// lift takes the previous stage's reason away, leaving every later one in place.
		lift func()
	}{
		{"task_not_active", func() {
			// Every reason at once: a finished step of a task in error, paused and scheduled.
			b.setStep(ids["s"], `state = 'complete', attempts = 1, completed_at = $2`, at)
			b.setTask(task, `status = 'error', paused = true, run_at = $2`, at.Add(time.Hour))
		}},
		{"task_paused", func() { b.setTask(task, `status = 'in_progress'`) }},
		{"scheduled", func() { b.setTask(task, `paused = false`) }},
		{"terminal", func() { b.setTask(task, `run_at = NULL`) }},
		{"in_flight", func() {
			b.setStep(ids["s"], `state = 'enqueued', completed_at = NULL, lease_owner = 'w', lease_expires_at = $2`,
				at.Add(time.Hour))
		}},
		{"waiting_for_signal", func() {
			// A wait step (SPEC §20) waiting for its signal; every reason below still applies to its row.
			b.setStep(ids["s"], `state = 'waiting', lease_owner = NULL, lease_expires_at = NULL, wait = '{"signal": "go"}',
				attempts = 1, max_attempts = 1, retryable = false, next_attempt_at = $2`, at.Add(time.Hour))
			b.setTask(task, `status = 'in_progress'`)
		}},
		{"sleeping", func() { b.setStep(ids["s"], `wait = '{"duration_ms": 5}'`) }},
		{"waiting_for_dependencies", func() { b.setStep(ids["s"], `state = 'waiting_for_retry', wait = NULL`) }},
		{"map_window", func() {
			// s becomes an element (of p, for the test) held out of its map's window.
			b.setStep(ids["p"], `state = 'complete', attempts = 1, completed_at = $2`, at)
			b.setStep(ids["s"], `map_step_id = $2, element_index = 0, pending_parents = 1`, ids["p"])
		}},
		{"not_retryable", func() { b.setStep(ids["s"], `map_step_id = NULL, element_index = NULL, pending_parents = 0`) }},
		{"retries_exhausted", func() { b.setStep(ids["s"], `retryable = true`) }},
		{"backoff", func() { b.setStep(ids["s"], `max_attempts = 3`) }},
		{"concurrency_limited", func() { b.setStep(ids["s"], `next_attempt_at = NULL`) }},
		{"rate_limited", func() {
			b.setStep(holder, `state = 'complete', lease_owner = NULL, lease_expires_at = NULL, completed_at = $2`, at)
		}},
		{"", func() { b.exec(`DELETE FROM stepready.flow_state WHERE key = 'r'`) }},
	}
	var walked []string
	for _, st := range stages {
		st.lift()
		r := b.stepReadiness(task, ids["s"], at)
		got := exExplain(b, `stepready.explain_step($1, $2)`, ids["s"], at)
		if st.want == "" {
			// No reason left: ready, and explain's one row is its wait for a worker of its queue and handler.
			require.True(t, r.Ready, "no reason left: ready")
			require.Equal(t, []string{"waiting_for_worker"}, exReasons(got))
			require.Equal(t, rank["waiting_for_worker"], got[0].Rank, "explain's rank of waiting_for_worker is the list's")
			walked = append(walked, "waiting_for_worker")
			continue
		}
		walked = append(walked, st.want)
		require.NotNil(t, r.BlockedReason, st.want)
		require.Equal(t, st.want, *r.BlockedReason, "step_readiness")
		require.NotEmpty(t, got, st.want)
		require.Equal(t, st.want, got[0].Reason, "explain's first row")
		for _, row := range got {
			require.Equal(t, rank[row.Reason], row.Rank, "explain's rank of %s is the list's", row.Reason)
		}
	}
	require.Equal(t, reasons, walked, "the reasons in the order step_readiness reports them are the list")
}

func TestExecutionStatusesPrecedence(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	at := testBase
	statuses := listNames(t, b, `SELECT rank, execution_status FROM stepready.execution_statuses() ORDER BY rank`)
	status := func(task int64) string {
		t.Helper()
		return b.execContext(task, at).ExecutionStatus
	}

	// One step for each status: e fails, r is ready, f is in flight, wt waits for a signal, fl is held by its key
	// (held by h of another task), bo waits out a backoff, d waits for x, which has used its attempts.
	task := b.createTask(`{"name": "statuses", "steps": [
		{"name": "e", "handler": "noop"},
		{"name": "r", "handler": "noop"},
		{"name": "f", "handler": "noop"},
		{"name": "fl", "handler": "noop", "concurrency": {"key": "k", "limit": 1}},
		{"name": "bo", "handler": "noop"},
		{"name": "x", "handler": "noop"},
		{"name": "d", "handler": "noop", "depends_on": ["x"]},
		{"name": "wt", "handler": "noop"}]}`)
	ids := b.stepIDs(task)
	holderTask := b.createTask(`{"name": "holder", "steps": [
		{"name": "h", "handler": "noop", "concurrency": {"key": "k", "limit": 1}}]}`)
	b.setStep(b.stepIDs(holderTask)["h"], `state = 'in_progress', attempts = 1, lease_owner = 'w', lease_expires_at = $2`,
		at.Add(time.Hour))
	complete := func(name string) {
		b.setStep(ids[name], `state = 'complete', attempts = 1, lease_owner = NULL, lease_expires_at = NULL,
			next_attempt_at = NULL, completed_at = $2`, at)
	}
	b.setStep(ids["f"], `state = 'in_progress', attempts = 1, lease_owner = 'w', lease_expires_at = $2`, at.Add(time.Hour))
	b.setStep(ids["bo"], `state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2`, at.Add(time.Minute))
	b.setStep(ids["x"], `state = 'waiting_for_retry', attempts = 3, max_attempts = 3`)
	b.setStep(ids["e"], `state = 'error', attempts = 3, max_attempts = 3`)
	b.setStep(ids["wt"], `state = 'waiting', attempts = 1, wait = '{"signal": "go"}'`)

	stages := []struct {
		want string
		lift func()
	}{
		{"cancelled", func() { b.setTask(task, `status = 'cancelled', paused = true`) }},
		{"paused", func() { b.setTask(task, `status = 'in_progress'`) }},
		{"blocked_by_failures", func() { b.setTask(task, `paused = false`) }},
		{"has_ready_steps", func() { complete("e"); b.setTask(task, `status = 'in_progress'`) }},
		{"processing", func() { complete("r") }},
		// all_complete cannot hold beside the statuses below it (they all have an unsatisfied step): checked on a
		// task of its own, below.
		{"waiting", func() { complete("f") }},
		{"scheduled", func() { complete("wt"); b.setTask(task, `run_at = $2`, at.Add(time.Hour)) }},
		{"flow_limited", func() { b.setTask(task, `run_at = NULL`) }},
		{"waiting_for_retry", func() { complete("fl") }},
		{"waiting_for_dependencies", func() { complete("bo") }},
	}
	var walked []string
	for _, st := range stages {
		st.lift()
		require.Equal(t, st.want, status(task))
		walked = append(walked, st.want)
	}

	// all_complete: below paused (and cancelled), above the rest, which a complete task cannot have.
	done := b.createTask(`{"name": "done", "steps": [{"name": "a", "handler": "noop"}]}`)
	b.setStep(b.stepIDs(done)["a"], `state = 'complete', attempts = 1, completed_at = $2`, at)
	b.setTask(done, `paused = true`)
	require.Equal(t, "paused", status(done))
	b.setTask(done, `paused = false`)
	require.Equal(t, "all_complete", status(done))
	i := 0
	for i < len(walked) && walked[i] != "scheduled" {
		i++
	}
	walked = append(walked[:i], append([]string{"all_complete"}, walked[i:]...)...)
	require.Equal(t, statuses, walked, "the statuses in the order task_execution_context reports them are the list")
}
