package main

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/console"
)

// Every face prints the same words (issue 26): for a step held back by each reason of
// stepready.readiness_reasons(), `scheduler task show`, `scheduler explain` and the console's task page print
// explain's message for its first reason, and `task show` and the console head the task with the execution status
// of task_execution_context.
func TestFacesPrintTheSameWords(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	ctx := context.Background()
	now := time.Now()

	// One active task whose steps are held by every reason a step of a running task can have, and one task for
	// each task-level reason.
	active := b.createTask(`{"name": "faces", "steps": [
		{"name": "running", "handler": "noop"},
		{"name": "child", "handler": "noop", "depends_on": ["running"]},
		{"name": "no_retry", "handler": "noop"},
		{"name": "spent", "handler": "noop"},
		{"name": "later", "handler": "noop"},
		{"name": "keyed", "handler": "noop", "concurrency": {"key": "tenant:1", "limit": 1}},
		{"name": "metered", "handler": "noop", "rate_limit": {"key": "api:x", "limit": 1, "period_ms": 3600000}},
		{"name": "ready", "handler": "noop"},
		{"name": "done", "handler": "noop"}]}`)
	holder := b.createTask(`{"name": "holder", "steps": [
		{"name": "h", "handler": "noop", "concurrency": {"key": "tenant:1", "limit": 1}}]}`)
	set := func(task int64, step, sql string, args ...any) {
		b.exec(`UPDATE stepready.steps SET `+sql+` WHERE id = $1`, append([]any{b.stepID(task, step)}, args...)...)
	}
	set(holder, "h", `state = 'in_progress', attempts = 1, lease_owner = 'w', lease_expires_at = $2`, now.Add(time.Hour))
	set(active, "running", `state = 'in_progress', attempts = 1, lease_owner = 'w', lease_expires_at = $2`, now.Add(time.Hour))
	set(active, "no_retry", `state = 'waiting_for_retry', attempts = 1, retryable = false`)
	set(active, "spent", `state = 'waiting_for_retry', attempts = 3, max_attempts = 3`)
	set(active, "later", `state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2`, now.Add(time.Hour))
	set(active, "done", `state = 'complete', attempts = 1, completed_at = $2`, now)
	b.exec(`INSERT INTO stepready.flow_state (key, rate_tat) VALUES ('api:x', $1)`, now.Add(time.Hour))

	paused := b.createTask(`{"name": "paused", "steps": [{"name": "a", "handler": "noop"}]}`)
	b.exec(`SELECT stepready.pause_task($1)`, paused)
	scheduled := b.createTask(`{"name": "scheduled", "steps": [{"name": "a", "handler": "noop"}]}`)
	b.exec(`UPDATE stepready.tasks SET run_at = $2 WHERE id = $1`, scheduled, now.Add(time.Hour))
	failed := b.createTask(`{"name": "failed", "steps": [{"name": "a", "handler": "noop"},
		{"name": "b", "handler": "noop"}]}`)
	set(failed, "a", `state = 'error', attempts = 1`)
	limited := b.createTask(`{"name": "limited", "steps": [
		{"name": "a", "handler": "noop", "rate_limit": {"key": "api:x", "limit": 1, "period_ms": 3600000}}]}`)

	c, err := console.New(b.pool, console.Options{})
	require.NoError(t, err)
	t.Cleanup(c.Close)

	seen := map[string]bool{}
	for _, task := range []int64{active, paused, scheduled, failed, limited} {
		id := strconv.FormatInt(task, 10)
		show, stderr, err := b.run("task", "show", id)
		require.NoError(t, err, stderr)
		explain, stderr, err := b.run("explain", id)
		require.NoError(t, err, stderr)
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/tasks/"+id, nil))
		require.Equal(t, http.StatusOK, rec.Code)
		body, err := io.ReadAll(rec.Body)
		require.NoError(t, err)
		page := html.UnescapeString(string(body))

		// The heading: task_execution_context's status, on both faces.
		var status string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT execution_status FROM stepready.task_execution_context($1)`,
			task).Scan(&status))
		seen["status "+status] = true
		require.Regexp(t, `^task `+id+` "[a-z]+" \([a-z_, ]+\): `+status+"\n", show, "task show's heading")
		require.Contains(t, page, `<span class="execution" title="task_execution_context's execution_status">`+status+`</span>`,
			"the console's heading")

		// Each step: explain's first message, on every face.
		rows, err := b.pool.Query(ctx, `SELECT DISTINCT ON (step_id) step_name, reason, message
			FROM stepready.explain_task($1) WHERE state IN ('pending', 'waiting_for_retry', 'enqueued', 'in_progress')
			ORDER BY step_id, rank, parent_step_id`, task)
		require.NoError(t, err)
		type first struct{ step, reason, message string }
		var firsts []first
		for rows.Next() {
			var f first
			require.NoError(t, rows.Scan(&f.step, &f.reason, &f.message))
			firsts = append(firsts, f)
		}
		require.NoError(t, rows.Err())
		for _, f := range firsts {
			seen[f.reason] = true
			msg := sameWords(f.message)
			require.Contains(t, sameWords(lineOf(explain, " "+f.step+" ")), msg, "explain, step %s", f.step)
			if f.reason == "waiting_for_worker" {
				// A ready step: task show's column says yes, the console's task page leaves its column empty (its
				// step page lists the reason); explain names the worker it waits for.
				require.Contains(t, lineOf(show, f.step+" "), " yes ", "task show, step %s", f.step)
				continue
			}
			require.Contains(t, sameWords(lineOf(show, f.step+" ")), msg, "task show, step %s", f.step)
			require.Contains(t, sameWords(rowOf(page, f.step)), msg, "console, step %s", f.step)
		}
	}
	for _, want := range []string{"task_not_active", "task_paused", "scheduled", "in_flight", "waiting_for_dependencies",
		"not_retryable", "retries_exhausted", "backoff", "concurrency_limited", "rate_limited", "waiting_for_worker",
		"status has_ready_steps", "status paused", "status scheduled", "status blocked_by_failures", "status flow_limited"} {
		require.True(t, seen[want], "no fixture shows %s", want)
	}
}

// durationWords matches the waits of a message, which move between two reads ("(in 59m59s)", "in 0.8s").
var durationWords = regexp.MustCompile(`\b\d+(\.\d+)?(ms|s|m|h|d)(\d+(s|m|h))?\b`)

// sameWords is a message with its waits blanked and its white space collapsed.
func sameWords(s string) string {
	return strings.Join(strings.Fields(durationWords.ReplaceAllString(s, "…")), " ")
}

// lineOf returns the first line of out that contains marker.
func lineOf(out, marker string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, marker) {
			return l
		}
	}
	return ""
}

// rowOf returns the console's table row of a step (its data-step attribute).
func rowOf(page, step string) string {
	i := strings.Index(page, `<tr data-step="`+step+`">`)
	if i < 0 {
		return ""
	}
	j := strings.Index(page[i:], "</tr>")
	if j < 0 {
		return page[i:]
	}
	return page[i : i+j]
}
