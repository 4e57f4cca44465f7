package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/rules"
	"github.com/stepready/stepready/steps"
)

// insertTask writes a task definition with plain SQL INSERTs into tasks, steps and step_edges in one
// transaction (SPEC §2: a supported way to define a task, on which nothing compiles CEL), steps in the
// definition's order. It returns the task's id.
func (b *bundle) insertTask(t *testing.T, def string) int64 {
	t.Helper()
	var d struct {
		Name  string
		Steps []struct {
			Name, Handler string
			Rules         json.RawMessage
			DependsOn     []string `json:"depends_on"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(def), &d))
	ctx := context.Background()
	var taskID int64
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO stepready.tasks (name) VALUES ($1) RETURNING id`, d.Name).Scan(&taskID); err != nil {
			return err
		}
		ids := map[string]int64{}
		for _, st := range d.Steps {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO stepready.steps (task_id, name, handler, rules)
				VALUES ($1, $2, $3, $4) RETURNING id`, taskID, st.Name, st.Handler, st.Rules).Scan(&id); err != nil {
				return err
			}
			ids[st.Name] = id
			for _, parent := range st.DependsOn {
				if _, err := tx.Exec(ctx, `INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
					VALUES ($1, $2)`, ids[parent], id); err != nil {
					return err
				}
			}
		}
		return nil
	}))
	return taskID
}

// A task inserted by plain SQL with a rule that does not compile: the daemon fails that step before calling its
// handler, as `deterministic` and never retried, with the message stepready.CreateTask gives for the same
// definition. Nothing crashes and the rest of the task ran.
func TestUncompilableRulesFromSQLFailTheStepBeforeItsHandler(t *testing.T) {
	t.Parallel()
	const def = `{"name": "bad_rules", "steps": [
		{"name": "prepare", "handler": "noop"},
		{"name": "fetch", "handler": "counted", "depends_on": ["prepare"], "rules": [
			{"when": "outcome.status == 'error' && outcome.http.status in [429, 503]", "then": {"do": "retry"}},
			{"when": "outcome.result.items.size() >", "then": {"do": "break"}}]}]}`
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var calls atomic.Int32
			b.reg.MustRegister("counted", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
				calls.Add(1)
				return map[string]any{"items": []int{1}}, nil
			}))

			// What a user of the library (and of the CLI, which calls the same validation) is told.
			_, createErr := stepready.CreateTask(context.Background(), b.db.Pool, []byte(def))
			require.ErrorIs(t, createErr, stepready.ErrInvalidDefinition)
			stepErr, ok := errors.AsType[*rules.StepError](createErr)
			require.True(t, ok, "CreateTask names the step: %v", createErr)
			want := stepErr.Error()
			require.Contains(t, want, `steps[1] "fetch": rules[1].when: ERROR: <input>:1:`)

			b.start(t, stepready.Config{Dispatch: mode, PollInterval: time.Minute, ReapInterval: time.Second})
			id := b.insertTask(t, def)
			b.waitTask(t, id, 20*time.Second, "error")

			require.Zero(t, calls.Load(), "the handler was never called")
			require.Equal(t, "complete", b.polStep(t, id, "prepare").State)
			fetch := b.polStep(t, id, "fetch")
			require.Equal(t, "error", fetch.State)
			require.Equal(t, 1, fetch.Attempts, "never retried")
			require.Equal(t, "deterministic", fetch.LastError["class"])
			require.Equal(t, "not_retryable", fetch.LastError["reason"])
			require.Equal(t, want, fetch.LastError["message"], "the creation-time message, word for word")
			require.Empty(t, b.polEventDetails(t, fetch.ID, "policy.evaluated"))
		})
	}
}

// Failure classes are data (SPEC §2). A class an operator adds with retryable = false works with no code: one
// INSERT, and a handler failing with it ends its step after one attempt with reason not_retryable. A class that
// is in no row is recorded as given and treated as `transient`: retried on the step's policy, not counted by the
// breaker.
func TestFailureClassesAreData(t *testing.T) {
	t.Parallel()
	const classSQL = `INSERT INTO stepready.failure_classes (name, retryable, breaker) VALUES ('invalid_invoice', false, false)`
	cases := []struct {
		name      string
		class     string
		failures  int // attempts that fail before one succeeds
		state     string
		attempts  int
		reason    string
		retryGaps int // retry.scheduled events
	}{
		{name: "a user-added non-retryable class", class: "invalid_invoice", failures: 10,
			state: "error", attempts: 1, reason: "not_retryable"},
		{name: "an unknown class is retried like transient", class: "flux_capacitor", failures: 2,
			state: "complete", attempts: 3, retryGaps: 2},
		{name: "an unknown class exhausts the budget, the breaker never opens", class: "flux_capacitor", failures: 10,
			state: "error", attempts: 4, reason: "retries_exhausted", retryGaps: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			_, err := b.db.Pool.Exec(context.Background(), classSQL)
			require.NoError(t, err)
			b.reg.MustRegister("billing", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
				if s.Attempt <= tc.failures {
					// The same message every time: three in a row would open the breaker of a breaker class.
					return nil, steps.Fail(tc.class, fmt.Errorf("invoice 1234 rejected"))
				}
				return map[string]int{"attempt": s.Attempt}, nil
			}))
			b.start(t, stepready.Config{Dispatch: stepready.DispatchDirect, PollInterval: time.Minute, ReapInterval: time.Second})
			id := b.createTask(t, `{"name": "bill", "steps": [{"name": "bill", "handler": "billing", "breaker_limit": 3,
				"retry": {"max_attempts": 4, "backoff": "fixed", "base_delay_ms": 20, "jitter": 0}}]}`)
			b.waitTask(t, id, 20*time.Second, tc.state)

			st := b.polStep(t, id, "bill")
			require.Equal(t, tc.state, st.State)
			require.Equal(t, tc.attempts, st.Attempts)
			failed := b.polEventDetails(t, st.ID, "attempt.failed")
			require.Len(t, failed, min(tc.failures, tc.attempts))
			for i, d := range failed {
				require.Equal(t, tc.class, d["class"], "failure %d: the class as the handler gave it", i+1)
			}
			delays := make([]int64, tc.retryGaps)
			for i := range delays {
				delays[i] = 20
			}
			b.polRequireSchedule(t, st.ID, delays...)
			if tc.reason != "" {
				require.Equal(t, tc.reason, st.LastError["reason"])
				require.Equal(t, tc.class, st.LastError["class"])
			}
		})
	}
}

// A panic is an attempt like any other for the rules (SPEC §8, §11): a rule matching it decides, here to
// continue past it, and the panic's class, message and stack stay in the step's record.
func TestRulesJudgeAPanic(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.reg.MustRegister("panics", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
				panic("optional enrichment exploded")
			}))
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: time.Minute, ReapInterval: time.Second})
			id := b.createTask(t, `{"name": "p", "steps": [
				{"name": "enrich", "handler": "panics", "rules": [
					{"when": "outcome.status == 'error' && outcome.error.class == 'permanent' && outcome.error.message.startsWith('handler panicked:')",
					 "then": {"do": "continue"}}]},
				{"name": "publish", "handler": "noop", "depends_on": ["enrich"]}]}`)
			b.waitTask(t, id, 20*time.Second, "complete")

			enrich := b.polStep(t, id, "enrich")
			require.Equal(t, "complete", enrich.State)
			require.Equal(t, 1, enrich.Attempts)
			evals := b.polEventDetails(t, enrich.ID, "policy.evaluated")
			require.Len(t, evals, 1)
			require.Equal(t, "continue", evals[0]["decision"])
			require.Equal(t, float64(0), evals[0]["rule_index"])
			// Completed, so no attempt.failed: the event keeps the panic the rule judged.
			panicked, ok := evals[0]["error"].(map[string]any)
			require.True(t, ok, "policy.evaluated details: %v", evals[0])
			require.Equal(t, "permanent", panicked["class"])
			require.Equal(t, "handler panicked: optional enrichment exploded", panicked["message"])
			require.Contains(t, panicked["stack"], "goroutine")
			require.Equal(t, "complete", b.polStep(t, id, "publish").State)
		})
	}
}
