package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// Issue 21, SPEC §18, end to end in both dispatch modes: a child's handler receives its parents' outputs in
// Step.Deps (read with Step.Dep) and its input with the references resolved, a non-element step has Index -1,
// outcome rules see `deps`, and an output over the database's cap fails the attempt as contract_failure.
func TestDataFlowEndToEnd(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			type seen struct {
				input, deps json.RawMessage
				index       int
				files       []string
				missingErr  error
			}
			var mu sync.Mutex
			got := map[string]seen{}
			b.reg.MustRegister("list", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
				return map[string]any{"files": []string{"a.csv", "b.csv"}, "n": 2}, nil
			}))
			b.reg.MustRegister("use", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
				var list struct {
					Files []string `json:"files"`
				}
				if err := s.Dep("list", &list); err != nil {
					return nil, err
				}
				var nothing any
				missing := s.Dep("nope", &nothing)
				mu.Lock()
				got[s.Name] = seen{input: s.Input, deps: s.Deps, index: s.Index, files: list.Files, missingErr: missing}
				mu.Unlock()
				if s.Name == "judged" {
					return nil, errors.New("the rule on deps completes the step anyway")
				}
				if s.Name == "too-big" {
					return json.RawMessage(`"` + strings.Repeat("x", 60) + `"`), nil
				}
				return len(list.Files), nil
			}))
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: 200 * time.Millisecond})
			_, err := b.db.Pool.Exec(ctx, `UPDATE stepready.settings SET value = '50' WHERE name = 'max_output_bytes'`)
			require.NoError(t, err)

			taskID := b.createTask(t, `{"name": "flow", "context": {"region": "eu"}, "steps": [
				{"name": "list", "handler": "list"},
				{"name": "use", "handler": "use", "depends_on": ["list"],
				 "input": {"first": "${deps.list.files.0}", "all": "${deps.list.files}", "where": "${context.region}/${task.id}"}},
				{"name": "judged", "handler": "use", "depends_on": ["list"], "retry": {"max_attempts": 1},
				 "rules": [{"when": "outcome.status == 'error' && deps.list.n == 2", "then": {"do": "continue"}}]},
				{"name": "too-big", "handler": "use", "depends_on": ["list"], "retry": {"max_attempts": 1},
				 "on_exhausted": "skip"}]}`)
			require.Equal(t, "complete", b.waitTask(t, taskID, 30*time.Second, "complete", "error"))

			mu.Lock()
			defer mu.Unlock()
			use := got["use"]
			require.JSONEq(t, fmt.Sprintf(`{"first": "a.csv", "all": ["a.csv", "b.csv"], "where": "eu/%d"}`, taskID),
				string(use.input), "the resolved input")
			require.JSONEq(t, `{"list": {"files": ["a.csv", "b.csv"], "n": 2}}`, string(use.deps), "Step.Deps")
			require.Equal(t, []string{"a.csv", "b.csv"}, use.files, "Step.Dep")
			require.Equal(t, -1, use.index, "Step.Index of a step that is not an element")
			var depErr *steps.DepError
			require.ErrorAs(t, use.missingErr, &depErr)
			require.ErrorIs(t, use.missingErr, steps.ErrNoDep)

			var state, judged, class, msg string
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT
				(SELECT state FROM stepready.steps WHERE task_id = $1 AND name = 'judged'),
				s.state, s.last_error ->> 'class', s.last_error ->> 'message'
				FROM stepready.steps s WHERE s.task_id = $1 AND s.name = 'too-big'`, taskID).
				Scan(&judged, &state, &class, &msg))
			require.Equal(t, "complete", judged, "the rule saw deps")
			require.Equal(t, "skipped", state, "the output over the cap failed the attempt")
			require.Equal(t, "contract_failure", class)
			require.Contains(t, msg, "output is 62 bytes, over the limit of 50 bytes")
		})
	}
}
