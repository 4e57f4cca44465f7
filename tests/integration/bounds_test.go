package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/store"
)

// Issue 25: every value that reaches River or the Go runtime from a definition is refused where it is written,
// on every path, naming the step and the field (sql/015_bounds.sql, migration 000010).

const maxDurationMS = int64(9223372036854) // the longest whole-millisecond Go time.Duration

var (
	longKey     = strings.Repeat("k", 256)
	longHandler = strings.Repeat("h", 256)
	longQueue   = strings.Repeat("q", 65)
)

// boundCase is one value beyond a bound, as a definition's step field and as a steps column.
type boundCase struct {
	name string
	// step is the JSON of the offending step's fields (besides name and handler); field is what the definition
	// path's message names after the step.
	step, field string
	// column and value are the same bound broken by a plain INSERT into steps (column "" when the definition field
	// has no column of its own); colField is what the trigger's message names.
	column, value, colField string
	// constraint is the CHECK constraint an UPDATE of the column runs into ("" when none is tested).
	constraint string
}

var boundCases = []boundCase{
	{"queue with a space", `"queue": "bad queue!"`, "queue: must be a River queue name",
		"queue", "'bad queue!'", "queue: must be a River queue name", "steps_queue_is_a_river_queue_name"},
	{"queue with a capital", `"queue": "Emails"`, "queue: must be a River queue name",
		"queue", "'Emails'", "queue: must be a River queue name", "steps_queue_is_a_river_queue_name"},
	{"queue with two separators", `"queue": "a__b"`, "queue: must be a River queue name",
		"queue", "'a__b'", "queue: must be a River queue name", "steps_queue_is_a_river_queue_name"},
	{"queue starting with a separator", `"queue": "-a"`, "queue: must be a River queue name",
		"queue", "'-a'", "queue: must be a River queue name", "steps_queue_is_a_river_queue_name"},
	{"queue of 65 characters", `"queue": "` + longQueue + `"`, "queue: must be a River queue name of at most 64",
		"queue", "'" + longQueue + "'", "queue: must be a River queue name of at most 64", "steps_queue_is_a_river_queue_name"},
	{"handler of 256 characters", `"handler": "` + longHandler + `"`, "handler: must be at most 255 characters",
		"handler", "'" + longHandler + "'", "handler: must be at most 255 characters", "steps_handler_at_most_255_characters"},
	{"timeout beyond a Go duration", fmt.Sprintf(`"timeout_ms": %d`, maxDurationMS+1),
		fmt.Sprintf("timeout_ms: must be at most %d ms", maxDurationMS),
		"timeout_ms", fmt.Sprint(maxDurationMS + 1), fmt.Sprintf("timeout_ms: must be at most %d ms", maxDurationMS),
		"steps_timeout_ms_fits_a_go_duration"},
	{"timeout of 1e16", `"timeout_ms": 1e16`, "timeout_ms: must be at most",
		"timeout_ms", "1e16", "timeout_ms: must be at most", "steps_timeout_ms_fits_a_go_duration"},
	{"base delay beyond a Go duration", fmt.Sprintf(`"retry": {"base_delay_ms": %d}`, maxDurationMS+1),
		"retry.base_delay_ms: must be at most",
		"base_delay_ms", fmt.Sprint(maxDurationMS + 1), "base_delay_ms: must be at most",
		"steps_base_delay_ms_fits_a_go_duration"},
	{"max delay beyond a Go duration", fmt.Sprintf(`"retry": {"max_delay_ms": %d}`, maxDurationMS+1),
		"retry.max_delay_ms: must be at most",
		"max_delay_ms", fmt.Sprint(maxDurationMS + 1), "max_delay_ms: must be at most",
		"steps_max_delay_ms_fits_a_go_duration"},
	{"rate period of 1e16", `"rate_limit": {"key": "api", "limit": 1, "period_ms": 1e16}`,
		"rate_limit: period_ms: must be at most",
		"", "", "", ""},
	{"concurrency key of 256 characters", `"concurrency": {"key": "` + longKey + `", "limit": 1}`,
		"concurrency: key: must be at most 255 characters",
		"", "", "", ""},
	{"rate key of 256 characters", `"rate_limit": {"key": "` + longKey + `", "limit": 1, "period_ms": 1000}`,
		"rate_limit: key: must be at most 255 characters",
		"", "", "", ""},
	{"key that a placeholder makes too long", `"input": {"k": "` + longKey + `"}, "concurrency": {"key": "${input.k}", "limit": 1}`,
		"concurrency: key: must be at most 255 characters",
		"", "", "", ""},
}

// requireBoundError requires err to be SQLSTATE code with every fragment in its message.
func requireBoundError(t *testing.T, err error, code string, fragments ...string) {
	t.Helper()
	require.Error(t, err)
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	require.True(t, ok, "not a PostgreSQL error: %v", err)
	require.Equal(t, code, pgErr.Code, pgErr.Message)
	for _, f := range fragments {
		require.Contains(t, pgErr.Message, f)
	}
}

func stepDef(step boundCase) string {
	fields := step.step
	if !strings.Contains(fields, `"handler"`) {
		fields += `, "handler": "noop"`
	}
	return `{"name": "a", ` + fields + `}`
}

func TestDefinitionBoundsOnEveryPath(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	for _, tt := range boundCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			def := `{"name": "t", "steps": [` + stepDef(tt) + `]}`

			// create_task, and Go's CreateTask, the CLI and YAML templates through it.
			requireBoundError(t, b.createTaskErr(def), "22023", `steps[0] "a": `+tt.field)
			// create_tasks: the element is named, nothing is written.
			requireBoundError(t, b.execErr(`SELECT * FROM stepready.create_tasks($1::jsonb)`,
				`[{"name": "ok", "steps": [{"name": "a", "handler": "noop"}]}, `+def+`]`),
				"22023", `definitions[1]: steps[0] "a": `+tt.field)
			// A template is refused when it is stored.
			requireBoundError(t, b.execErr(`INSERT INTO stepready.task_templates (name, definition) VALUES ('tpl', $1)`,
				def), "22023", `template "tpl" version 1: steps[0] "a": `+tt.field)
			// The task's default flow control and retry, for the fields that have one.
			if strings.HasPrefix(tt.step, `"concurrency"`) || strings.HasPrefix(tt.step, `"rate_limit"`) ||
				strings.HasPrefix(tt.step, `"retry"`) {
				taskLevel := `{"name": "t", ` + tt.step + `, "steps": [{"name": "a", "handler": "noop"}]}`
				err := b.createTaskErr(taskLevel)
				require.Error(t, err)
				require.Contains(t, err.Error(), "must be at most")
			}

			if tt.column != "" {
				// A plain INSERT: the insert trigger names the step and the column.
				taskID := b.insertTask("plain")
				requireBoundError(t, b.execErr(`INSERT INTO stepready.steps (task_id, name, `+
					strings.Join(uniq("handler", tt.column), ", ")+`) VALUES ($1, 's', `+
					strings.Join(uniqValues(tt.column, tt.value), ", ")+`)`, taskID),
					"22023", fmt.Sprintf(`step "s" of task %d: %s`, taskID, tt.colField))
				// An UPDATE of a row runs into the CHECK constraint, named after the rule.
				stepID := b.insertStep(taskID, "ok")
				requireBoundError(t, b.execErr(`UPDATE stepready.steps SET `+tt.column+` = `+tt.value+` WHERE id = $1`,
					stepID), "23514", tt.constraint)
				b.exec(`DELETE FROM stepready.tasks WHERE id = $1`, taskID)
			}
		})
	}
	// Nothing of a refused definition was written (the subtests share the database, and only refused
	// definitions use these names).
	require.Equal(t, int64(0), b.int64(`SELECT count(*) FROM stepready.tasks WHERE name IN ('t', 'ok')`))
	require.Equal(t, int64(0), b.count("task_templates"))
}

// uniq and uniqValues build the column and value lists of a plain INSERT of a step with one bad column (the
// handler column is itself the bad one for the handler case).
func uniq(cols ...string) []string {
	if cols[0] == cols[1] {
		return cols[:1]
	}
	return cols
}

func uniqValues(column, value string) []string {
	if column == "handler" {
		return []string{value}
	}
	return []string{"'noop'", value}
}

// The other writers of the same bounds: flow control's keys and periods through plain SQL and the operators'
// overrides, presets, task retry defaults and run_at, due times, and rows at each bound itself.
func TestDefinitionBoundsOfOtherTables(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	taskID := b.insertTask("plain")

	// Flow control columns of a plain INSERT, checked after placeholders are substituted.
	requireBoundError(t, b.execErr(`INSERT INTO stepready.steps (task_id, name, handler, rate_key, rate_limit,
		rate_period_ms) VALUES ($1, 's', 'noop', 'api', 1, 1e16)`, taskID),
		"22023", fmt.Sprintf(`step "s" of task %d: rate_period_ms: must be at most %d ms`, taskID, maxDurationMS))
	requireBoundError(t, b.execErr(`INSERT INTO stepready.steps (task_id, name, handler, input, concurrency_key,
		concurrency_limit) VALUES ($1, 's', 'noop', $2, '${input.k}', 1)`, taskID, `{"k": "`+longKey+`"}`),
		"22023", fmt.Sprintf(`step "s" of task %d: concurrency_key: must be at most 255 characters`, taskID))
	requireBoundError(t, b.execErr(`INSERT INTO stepready.steps (task_id, name, handler, next_attempt_at)
		VALUES ($1, 's', 'noop', 'infinity')`, taskID),
		"22023", fmt.Sprintf(`step "s" of task %d: next_attempt_at: must be a finite time`, taskID))

	// The task's own columns.
	requireBoundError(t, b.execErr(`INSERT INTO stepready.tasks (name, retry) VALUES ('r', $1)`,
		fmt.Sprintf(`{"max_delay_ms": %d}`, maxDurationMS+1)), "22023", `task "r": retry.max_delay_ms: must be at most`)
	requireBoundError(t, b.execErr(`INSERT INTO stepready.tasks (name, run_at) VALUES ('r', 'infinity')`),
		"23514", "tasks_run_at_is_finite")

	// Operators: overrides and presets.
	requireBoundError(t, b.execErr(`SELECT stepready.set_flow_limit('api', NULL, 1, 10000000000000000)`),
		"22023", `flow key "api": period: must be at most`)
	requireBoundError(t, b.execErr(`SELECT stepready.set_flow_limit($1, 1)`, longKey),
		"22023", `flow_limits: key: must be at most 255 characters`)
	requireBoundError(t, b.execErr(`INSERT INTO stepready.flow_limits (key, rate_limit, rate_period_ms)
		VALUES ('api', 1, 1e16)`), "23514", "flow_limits_rate_period_ms_fits_a_go_duration")
	requireBoundError(t, b.execErr(`INSERT INTO stepready.flow_limits (key, concurrency_limit) VALUES ($1, 1)`,
		longKey), "23514", "flow_limits_key_at_most_255_characters")
	requireBoundError(t, b.execErr(`INSERT INTO stepready.retry_policies (name, base_delay_ms) VALUES ('p', 1e16)`),
		"23514", "retry_policies_base_delay_ms_fits_a_go_duration")
	requireBoundError(t, b.execErr(`INSERT INTO stepready.retry_policies (name, max_delay_ms) VALUES ('p', 1e16)`),
		"23514", "retry_policies_max_delay_ms_fits_a_go_duration")
	requireBoundError(t, b.execErr(`INSERT INTO stepready.schedules (name, template, cron, next_fire_at)
		VALUES ('s', 't', '@hourly', 'infinity')`), "23514", "schedules_next_fire_at_is_finite")

	// Each bound itself is accepted.
	atBounds := b.createTask(fmt.Sprintf(`{"name": "edge", "retry": {"base_delay_ms": %[1]d, "max_delay_ms": %[1]d},
		"steps": [{"name": "a", "handler": "%[2]s", "queue": "%[3]s", "timeout_ms": %[1]d,
		           "concurrency": {"key": "%[4]s", "limit": 1},
		           "rate_limit": {"key": "%[4]s", "limit": 1, "period_ms": %[1]d}},
		          {"name": "b", "handler": "noop", "queue": "a|b-c_d"},
		          {"name": "c", "handler": "noop", "queue": "high-priority"}]}`,
		maxDurationMS, strings.Repeat("h", 255), strings.Repeat("q", 64), strings.Repeat("k", 255)))
	require.Equal(t, int64(3), b.int64(`SELECT count(*) FROM stepready.steps WHERE task_id = $1`, atBounds))
	b.exec(`SELECT stepready.set_flow_limit($1, 1, 1, $2)`, strings.Repeat("k", 255), maxDurationMS)
	b.exec(`INSERT INTO stepready.retry_policies (name, base_delay_ms, max_delay_ms) VALUES ('slow', $1, $1)`,
		maxDurationMS)
}

// A template's placeholders are resolved when a task is created from it: a context that makes a key too long is
// refused then, naming the step.
func TestTemplateContextBeyondABound(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	b.exec(`INSERT INTO stepready.task_templates (name, definition) VALUES ('tpl', $1)`,
		`{"context": {"t": "x"}, "steps": [{"name": "a", "handler": "noop",
		  "concurrency": {"key": "tenant:${context.t}", "limit": 1}}]}`)
	requireBoundError(t, b.execErr(`SELECT stepready.create_task_from_template('tpl', $1)`, `{"t": "`+longKey+`"}`),
		"22023", `steps[0] "a": concurrency: key: must be at most 255 characters`)
	requireBoundError(t, b.execErr(`SELECT * FROM stepready.create_tasks_from_template('tpl', $1)`,
		`[{"t": "x"}, {"t": "`+longKey+`"}]`), "22023", `definitions[1]: steps[0] "a": concurrency: key`)
	require.Equal(t, int64(0), b.count("tasks"))
}

// The queue name rule is River's own, in all four places that apply it: River's client, the Go copy the
// dispatchers check claimed rows with, the SQL function the definition checks and the insert trigger use, and the
// CHECK constraint.
func TestQueueNameRuleIsRiversOwn(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	ctx := t.Context()
	stepID := b.insertStep(b.insertTask("q"), "s")

	names := []string{"default", "a", "0", "emails", "high-priority", "a_b", "a|b", "a-b_c|d", "a1-2b", "abc123",
		strings.Repeat("a", 64), strings.Repeat("a", 65), "", "A", "Emails", "bad queue!", "a__b", "a--b", "a_-b",
		"-a", "a-", "_a", "a_", "|a", "a|", "a.b", "a b", "é", "ａ", "a\tb", "a\nb", "default ", " default",
		"a/b", "a:b", strings.Repeat("a-", 32), strings.Repeat("a-", 31) + "a", "DEFAULT", "a||b"}
	rnd := rand.New(rand.NewPCG(25, 25))
	const alphabet = "abz09_-|A .é"
	for range 300 {
		runes := []rune(alphabet)
		n := rnd.IntN(8)
		var sb strings.Builder
		for range n {
			sb.WriteRune(runes[rnd.IntN(len(runes))])
		}
		names = append(names, sb.String())
	}

	for _, name := range names {
		riverErr := riverQueueCheck(b.db.Pool, name)
		goErr := store.CheckQueueName(name)
		var problem *string
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT stepready._queue_problem($1)`, name).Scan(&problem))
		checkErr := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE stepready.steps SET queue = $2 WHERE id = $1`, stepID, name)
			if err == nil {
				return errors.New("rollback")
			}
			return err
		})
		riverOK := riverErr == nil
		require.Equal(t, riverOK, goErr == nil, "Go copy vs River for %q: %v / %v", name, goErr, riverErr)
		require.Equal(t, riverOK, problem == nil, "SQL function vs River for %q: %v", name, problem)
		if riverOK {
			require.EqualError(t, checkErr, "rollback", "CHECK constraint vs River for %q", name)
		} else {
			requireBoundError(t, checkErr, "23514", "steps_queue_is_a_river_queue_name")
		}
	}
}

// riverQueueCheck asks River's client whether it accepts name as a queue (its configuration is validated with
// the same function as every inserted job's queue).
func riverQueueCheck(pool *pgxpool.Pool, name string) error {
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[queueProbeArgs]) error { return nil }))
	_, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues: map[string]river.QueueConfig{name: {MaxWorkers: 1}}, Workers: workers})
	return err
}

type queueProbeArgs struct{}

func (queueProbeArgs) Kind() string { return "queue_probe" }
