package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func ptr[T any](v T) *T { return &v }

func TestEventLines(t *testing.T) {
	t.Parallel()
	ev := func(name, to, details string) event {
		e := event{Event: name, Attempt: ptr(2), Iteration: ptr(0)}
		if to != "" {
			e.ToState = &to
		}
		if details != "" {
			require.NoError(t, json.Unmarshal([]byte(details), &e.Details))
		}
		return e
	}
	tests := []struct {
		e    event
		want string
	}{
		{ev("attempt.started", "in_progress", ""), "attempt 2 started"},
		{ev("attempt.failed", "waiting_for_retry", `{"class": "transient", "error": {"message": "boom"}, "delay_ms": 1000}`),
			"attempt 2 failed (transient: boom) — retry in 1000 ms"},
		{ev("attempt.failed", "error", `{"class": "permanent", "error": {"message": "no"}, "reason": "not_retryable"}`),
			"attempt 2 failed (permanent: no) — not retryable"},
		{ev("attempt.failed", "error", `{"class": "x", "error": {"message": "a\nlong\n\nmessage"}, "reason": "circuit_open"}`),
			"attempt 2 failed (x: a long message) — circuit open"},
		{ev("step.failed", "error", `{"reason": "retries_exhausted"}`), "failed — the task is in error"},
		{ev("step.skipped", "skipped", `{"reason": "retries_exhausted"}`), "skipped (retries exhausted; on_exhausted: skip)"},
		{ev("step.skipped", "skipped", `{"reason": "ancestor_failed", "ancestor": "fetch"}`), "skipped (fetch was skipped)"},
		{ev("step.completed", "complete", ""), "completed"},
		{ev("iteration.continued", "pending", `{"delay_ms": 50}`), "iteration done — next in 50 ms"},
		{ev("step.released", "pending", ""), "handed back uncharged"},
		{ev("lease.expired", "pending", `{"lease_owner": "w1"}`), "lease of w1 expired"},
		{ev("operator.retry_now", "", ""), "operator: retry now"},
	}
	for _, tt := range tests {
		got, ok := tt.e.describe()
		require.True(t, ok, tt.e.Event)
		require.Equal(t, tt.want, got)
	}
	for _, hidden := range []event{ev("step.enqueued", "enqueued", ""), ev("retry.scheduled", "waiting_for_retry", ""),
		ev("attempt.succeeded", "complete", ""), ev("step.failed", "skipped", "")} {
		_, ok := hidden.describe()
		require.False(t, ok, hidden.Event)
	}
	require.Equal(t, "abcd…", truncate("abcdefgh", 5))
}

// TestAccountFollowsATask drives one task through the SQL functions by hand (no daemon) and checks what the
// account prints.
func TestAccountFollowsATask(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.New(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}

	// An earlier task: its events are not shown.
	exec(`SELECT stepready.create_task('{"name": "before", "steps": [{"name": "x", "handler": "noop"}]}')`)

	var out bytes.Buffer
	account, err := NewAccount(ctx, db.Pool, &out, Options{Interval: 10 * time.Millisecond, Location: time.UTC})
	require.NoError(t, err)

	var id int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task('{"name": "hand", "steps": [
		{"name": "only", "handler": "noop", "retry": {"backoff": "fixed", "base_delay_ms": 0}}]}')`).Scan(&id))
	// Claim, fail once, claim again, succeed. (The earlier task is claimed too; it stays enqueued.)
	exec(`SELECT stepready.claim_ready_steps(10, 'w', 30000)`)
	var stepID int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT id FROM stepready.steps WHERE task_id = $1", id).Scan(&stepID))
	exec(`SELECT stepready.start_step($1, 'w', 30000)`, stepID)
	exec(`SELECT stepready.fail_step($1, 1, '{"class": "transient", "message": "flap"}', now(), 0)`, stepID)
	exec(`SELECT stepready.claim_ready_steps(10, 'w', 30000)`)
	exec(`SELECT stepready.start_step($1, 'w', 30000)`, stepID)
	exec(`SELECT stepready.complete_step($1, 2, '{"ok": true}')`, stepID)

	require.NoError(t, account.Watch(ctx, []Task{{ID: id, Name: "hand"}}))
	text := out.String()
	require.NotContains(t, text, "before#")
	lines := strings.Split(strings.TrimSpace(text), "\n")
	require.GreaterOrEqual(t, len(lines), 6, text)
	for i, want := range []string{
		"hand#2        only           attempt 1 started",
		"hand#2        only           attempt 1 failed (transient: flap) — retry in 0 ms",
		"hand#2        only           attempt 2 started",
		"hand#2        only           completed",
		"task hand#2 complete",
	} {
		require.Contains(t, lines[i], want, text)
	}
	require.Contains(t, text, "summary: 1 task in ")
	require.Contains(t, text, "hand#2        complete  only: complete after 2 attempts")
}

// A claim's transaction may begin just before the completion it depends on commits: the child's events then carry
// an earlier time than the parent's completion. The account keeps each task's lines in the order things happened.
func TestAccountKeepsATasksLinesInCausalOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.New(t)
	var out bytes.Buffer
	account, err := NewAccount(ctx, db.Pool, &out, Options{Interval: 10 * time.Millisecond, Location: time.UTC})
	require.NoError(t, err)

	var id int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task('{"name": "pair", "steps": [
		{"name": "parent", "handler": "noop"}, {"name": "child", "handler": "noop", "depends_on": ["parent"]}]}')`).
		Scan(&id))
	base := time.Now()
	for _, c := range []struct {
		sql string
		at  time.Duration
	}{
		{`SELECT count(*) FROM stepready.claim_ready_steps(10, 'w', 30000, $1)`, 0},
		{`SELECT stepready.start_step(s.id, 'w', 30000, $1) FROM stepready.steps s WHERE s.name = 'parent'`, 0},
		{`SELECT stepready.complete_step(s.id, 1, '{}', $1) FROM stepready.steps s WHERE s.name = 'parent'`, 50 * time.Millisecond},
		// The child's claim is stamped 40 ms before the completion it follows.
		{`SELECT count(*) FROM stepready.claim_ready_steps(10, 'w', 30000, $1)`, 10 * time.Millisecond},
		{`SELECT stepready.start_step(s.id, 'w', 30000, $1) FROM stepready.steps s WHERE s.name = 'child'`, 10 * time.Millisecond},
		{`SELECT stepready.complete_step(s.id, 1, '{}', $1) FROM stepready.steps s WHERE s.name = 'child'`, 20 * time.Millisecond},
	} {
		_, err := db.Pool.Exec(ctx, c.sql, base.Add(c.at))
		require.NoError(t, err, c.sql)
	}

	require.NoError(t, account.Watch(ctx, []Task{{ID: id, Name: "pair"}}))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var order []string
	for _, l := range lines {
		for _, want := range []string{"parent         attempt 1 started", "parent         completed",
			"child          attempt 1 started", "child          completed", "task pair#"} {
			if strings.Contains(l, want) {
				order = append(order, want)
			}
		}
	}
	require.Equal(t, []string{"parent         attempt 1 started", "parent         completed",
		"child          attempt 1 started", "child          completed", "task pair#"}, order, out.String())
}
