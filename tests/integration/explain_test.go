package integration

// Boundary tests of stepready.explain_step and explain_task (sql/110_explain.sql): for every state and blocking
// condition of SPEC §5, the first reason equals step_readiness's blocked_reason, and every applicable reason is
// returned when several apply.

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// exReason is one row of explain_step, the columns the tests look at.
type exReason struct {
	StepID        int64
	Rank          int32
	Reason        string
	Message       string
	ParentName    *string
	ParentState   *string
	NextAttemptAt *time.Time
	WaitMs        *int64
}

func exExplain(b *schemaBundle, sql string, id int64, asOf time.Time) []exReason {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.t.Context(),
		`SELECT step_id, rank, reason, message, parent_name, parent_state, next_attempt_at, wait_ms FROM `+sql,
		id, asOf)
	require.NoError(b.t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[exReason])
	require.NoError(b.t, err)
	return got
}

func exReasons(rs []exReason) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Reason)
	}
	return out
}

func TestExplainStepAgreesWithStepReadiness(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	at := testBase

	tests := []struct {
		name string
		// arrange puts the task, the step "s" and its parents "p" and "q" (pending, no attempts) in place.
		arrange func(b *schemaBundle, task int64, ids map[string]int64)
		want    []string
	}{
		{"ready pending", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'skipped'`)
		}, nil},
		{"ready waiting_for_retry due exactly now", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'resolved_manually'`)
			b.setStep(ids["s"], `state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2`, at)
		}, nil},
		{"one parent unsatisfied", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
		}, []string{"waiting_for_dependencies"}},
		{"both parents unsatisfied: one row each", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'in_progress', attempts = 2`)
			b.setStep(ids["q"], `state = 'waiting_for_retry', attempts = 1`)
		}, []string{"waiting_for_dependencies", "waiting_for_dependencies"}},
		{"enqueued", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["s"], `state = 'enqueued'`)
		}, []string{"in_flight"}},
		{"in_progress at its last attempt", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["s"], `state = 'in_progress', attempts = 3, max_attempts = 3`)
		}, []string{"in_flight"}},
		{"complete", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["s"], `state = 'complete', attempts = 1, max_attempts = 1`)
		}, []string{"terminal"}},
		{"error (the task follows into error)", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["s"], `state = 'error', attempts = 3, max_attempts = 3`)
		}, []string{"task_not_active", "terminal"}},
		{"skipped", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["s"], `state = 'skipped'`)
		}, []string{"terminal"}},
		{"cancelled", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["s"], `state = 'cancelled'`)
		}, []string{"terminal"}},
		{"resolved_manually", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["s"], `state = 'resolved_manually'`)
		}, []string{"terminal"}},
		{"backoff one microsecond left", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'complete', attempts = 1`)
			b.setStep(ids["s"], `state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2`,
				at.Add(tick))
		}, []string{"backoff"}},
		{"delayed first attempt", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'complete', attempts = 1`)
			b.setStep(ids["s"], `next_attempt_at = $2`, at.Add(time.Hour))
		}, []string{"backoff"}},
		{"retries exhausted", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'complete', attempts = 1`)
			b.setStep(ids["s"], `state = 'waiting_for_retry', attempts = 3, max_attempts = 3`)
		}, []string{"retries_exhausted"}},
		{"max_attempts 0 allows the first attempt", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'complete', attempts = 1`)
			b.setStep(ids["s"], `max_attempts = 0`)
		}, nil},
		{"max_attempts 0 after the first attempt", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'complete', attempts = 1`)
			b.setStep(ids["s"], `state = 'waiting_for_retry', attempts = 1, max_attempts = 0`)
		}, []string{"retries_exhausted"}},
		{"not retryable after the first attempt", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'complete', attempts = 1`)
			b.setStep(ids["s"], `state = 'waiting_for_retry', attempts = 1, retryable = false`)
		}, []string{"not_retryable"}},
		{"not retryable first attempt allowed", func(b *schemaBundle, _ int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'complete', attempts = 1`)
			b.setStep(ids["s"], `retryable = false, max_attempts = 1`)
		}, nil},
		{"task paused", func(b *schemaBundle, task int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'complete', attempts = 1`)
			b.setTask(task, `paused = true`)
		}, []string{"task_paused"}},
		{"task in error", func(b *schemaBundle, task int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'complete', attempts = 1`)
			b.setStep(ids["q"], `state = 'complete', attempts = 1`)
			b.setTask(task, `status = 'error'`)
		}, []string{"task_not_active"}},
		{"task cancelled and paused, step cancelled", func(b *schemaBundle, task int64, ids map[string]int64) {
			b.setTask(task, `paused = true`)
			b.exec(`SELECT stepready.cancel_task($1, 'test', $2)`, task, at)
		}, []string{"task_not_active", "task_paused", "terminal"}},
		{"paused, parents unsatisfied, exhausted and in backoff", func(b *schemaBundle, task int64, ids map[string]int64) {
			b.setStep(ids["p"], `state = 'waiting_for_retry', attempts = 1`)
			b.setStep(ids["s"], `state = 'waiting_for_retry', attempts = 2, max_attempts = 2, next_attempt_at = $2`,
				at.Add(1800*time.Millisecond))
			b.setTask(task, `paused = true`)
		}, []string{"task_paused", "waiting_for_dependencies", "waiting_for_dependencies", "retries_exhausted",
			"backoff"}},
		{"everything at once", func(b *schemaBundle, task int64, ids map[string]int64) {
			b.setStep(ids["q"], `state = 'complete', attempts = 1`)
			b.setStep(ids["s"], `state = 'waiting_for_retry', attempts = 1, retryable = false, next_attempt_at = $2`,
				at.Add(time.Minute))
			b.setTask(task, `status = 'error', paused = true`)
		}, []string{"task_not_active", "task_paused", "waiting_for_dependencies", "not_retryable", "backoff"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			task := b.createTask(`{"name": "explain", "steps": [
				{"name": "p", "handler": "noop"},
				{"name": "q", "handler": "noop"},
				{"name": "s", "handler": "noop", "depends_on": ["p", "q"]}]}`)
			ids := b.stepIDs(task)
			tt.arrange(b, task, ids)

			got := exExplain(b, `stepready.explain_step($1, $2)`, ids["s"], at)
			if tt.want == nil {
				require.Equal(t, []string{"waiting_for_worker"}, exReasons(got), "a ready step waits for a worker")
			} else {
				require.Equal(t, tt.want, exReasons(got))
			}
			for i := 1; i < len(got); i++ {
				require.LessOrEqual(t, got[i-1].Rank, got[i].Rank, "rows in precedence order")
			}

			r := b.stepReadiness(task, ids["s"], at)
			if r.Ready {
				require.Equal(t, []string{"waiting_for_worker"}, exReasons(got),
					"a ready step has no reason but its wait for a worker")
			} else {
				require.NotEmpty(t, got)
				require.Equal(t, *r.BlockedReason, got[0].Reason, "first reason = blocked_reason")
			}

			// explain_task agrees with explain_step for every step of the task, and with step_readiness.
			all := exExplain(b, `stepready.explain_task($1, $2)`, task, at)
			for name, id := range ids {
				var mine []exReason
				for _, row := range all {
					if row.StepID == id {
						mine = append(mine, row)
					}
				}
				one := exExplain(b, `stepready.explain_step($1, $2)`, id, at)
				require.Len(t, mine, len(one), name)
				if len(one) > 0 {
					require.Equal(t, one, mine, name)
				}
				rr := b.stepReadiness(task, id, at)
				if rr.Ready {
					require.Equal(t, []string{"waiting_for_worker"}, exReasons(mine), name)
				} else {
					require.Equal(t, *rr.BlockedReason, mine[0].Reason, name)
				}
			}
		})
	}
}

func TestExplainStepDetails(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	// The backoff's clock time is shown in the session time zone: pin it.
	b.db.Pool = b.db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["timezone"] = "UTC" })
	at := time.Date(2030, 1, 1, 12, 0, 1, 200_000_000, time.UTC)

	task := b.createTask(`{"name": "details", "steps": [
		{"name": "fetch", "handler": "noop", "retry": {"max_attempts": 3}},
		{"name": "parse", "handler": "noop", "depends_on": ["fetch"]},
		{"name": "store", "handler": "noop", "retry": {"max_attempts": 3}},
		{"name": "once", "handler": "noop", "retry": {"policy": "none"}}]}`)
	ids := b.stepIDs(task)
	b.setStep(ids["fetch"], `state = 'in_progress', attempts = 2`)
	b.setStep(ids["store"], `state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2`,
		time.Date(2030, 1, 1, 12, 0, 3, 0, time.UTC))
	b.setStep(ids["once"], `state = 'waiting_for_retry', attempts = 1`)

	parse := exExplain(b, `stepready.explain_step($1, $2)`, ids["parse"], at)
	require.Len(t, parse, 1)
	require.Equal(t, "waiting for `fetch` (in_progress, attempt 2/3)", parse[0].Message)
	require.Equal(t, "fetch", *parse[0].ParentName)
	require.Equal(t, "in_progress", *parse[0].ParentState)

	fetch := exExplain(b, `stepready.explain_step($1, $2)`, ids["fetch"], at)
	require.Equal(t, "in flight: in_progress, attempt 2/3", fetch[0].Message)

	store := exExplain(b, `stepready.explain_step($1, $2)`, ids["store"], at)
	require.Len(t, store, 1)
	require.Equal(t, "backoff until 12:00:03 (in 1.8s)", store[0].Message)
	require.Equal(t, int64(1800), *store[0].WaitMs)

	once := exExplain(b, `stepready.explain_step($1, $2)`, ids["once"], at)
	require.Len(t, once, 1)
	require.Equal(t, "not retryable after first attempt", once[0].Message)

	b.setStep(ids["once"], `retryable = true, max_attempts = 1, next_attempt_at = $2`,
		time.Date(2030, 1, 2, 14, 3, 0, 0, time.UTC))
	b.setTask(task, `paused = true`)
	once = exExplain(b, `stepready.explain_step($1, $2)`, ids["once"], at)
	require.Equal(t, []string{"task paused", "retries exhausted 1/1", "backoff until 2030-01-02 14:03:00 (in 26h02m)"},
		[]string{once[0].Message, once[1].Message, once[2].Message})

	err := b.execErr(`SELECT * FROM stepready.explain_step(-1)`)
	requirePgError(t, err, "P0002", "step -1 does not exist")
	err = b.execErr(`SELECT * FROM stepready.explain_task(-1)`)
	requirePgError(t, err, "P0002", "task -1 does not exist")
}

// Explain's waits read like the CLI's durations: from two days on in days and hours (issue 26: a task scheduled
// for next year said "in 27179h28m").
func TestExplainDurationInDaysFromTwoDays(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	for ms, want := range map[int64]string{
		850:                            "0.9s",
		65_000:                         "1m05s",
		47*3_600_000 + 59*60_000:       "47h59m",
		48 * 3_600_000:                 "2d00h",
		1132*86_400_000 + 11*3_600_000: "1132d11h",
	} {
		var got string
		require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT stepready._explain_duration($1)`, ms).Scan(&got))
		require.Equal(t, want, got, "%d ms", ms)
	}
}
