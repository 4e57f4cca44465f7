package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// Flow control across two daemons, in both dispatch modes (SPEC §14): a concurrency key's handlers never run
// more than its limit at once anywhere, a rate key never starts more than its bucket allows, and both are driven
// by wake-ups (a freed slot notifies, a token's time arms the timer), not by polling: the poll interval is
// longer than the whole test.
func TestFlowLimitsAcrossTwoDaemons(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var mu sync.Mutex
			running, maxRunning := map[string]int{}, map[string]int{}
			b.reg.MustRegister("work", steps.HandlerFunc(func(ctx context.Context, s *steps.Step) (any, error) {
				key := strings.Trim(string(s.Input), "{}\" ")
				mu.Lock()
				running[key]++
				maxRunning[key] = max(maxRunning[key], running[key])
				mu.Unlock()
				defer func() {
					mu.Lock()
					running[key]--
					mu.Unlock()
				}()
				select { // the work itself: a short wait, not a wait for state
				case <-time.After(15 * time.Millisecond):
					return "done", nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}))
			for i := range 2 {
				b.start(t, stepready.Config{Dispatch: mode, WorkerID: fmt.Sprintf("d%d", i),
					PollInterval: time.Minute, Concurrency: 20})
			}

			// 30 steps on tenant a (limit 2), 30 on tenant b (limit 3), each in a task of its own.
			var tasks []int64
			for i := range 30 {
				for _, tenant := range []string{"a", "b"} {
					limit := map[string]int{"a": 2, "b": 3}[tenant]
					tasks = append(tasks, b.createTask(t, fmt.Sprintf(`{"name": "t%d", "context": {"tenant": %q},
						"concurrency": {"key": "tenant:${context.tenant}", "limit": %d},
						"steps": [{"name": "s", "handler": "work", "input": %q}]}`, i, tenant, limit, tenant)))
				}
			}
			// 10 steps on a rate key: 5 per 500 ms, a burst of 5 then one every 100 ms.
			var rated []int64
			for i := range 10 {
				rated = append(rated, b.createTask(t, fmt.Sprintf(`{"name": "r%d",
					"rate_limit": {"key": "api", "limit": 5, "period_ms": 500},
					"steps": [{"name": "s", "handler": "work", "input": "api"}]}`, i)))
			}
			for _, id := range append(tasks, rated...) {
				b.waitTask(t, id, 30*time.Second, "complete")
			}
			mu.Lock()
			require.LessOrEqual(t, maxRunning["a"], 2, "tenant a ran more than its limit at once")
			require.LessOrEqual(t, maxRunning["b"], 3, "tenant b ran more than its limit at once")
			require.Equal(t, 2, maxRunning["a"], "tenant a used its two slots")
			mu.Unlock()

			// The claims of the rate key (each takes a token; in River mode the start follows later), from the events:
			// by any time t after the first, at most
			// 5 + (t - first) / 100 ms of them (1 ms of slack for the timestamps' rounding).
			rows, err := b.db.Pool.Query(context.Background(), `SELECT e.at FROM stepready.step_events e
				JOIN stepready.steps s ON s.id = e.step_id
				WHERE s.rate_key = 'api' AND e.event = 'step.enqueued' ORDER BY e.at`)
			require.NoError(t, err)
			var starts []time.Time
			for rows.Next() {
				var at time.Time
				require.NoError(t, rows.Scan(&at))
				starts = append(starts, at)
			}
			require.NoError(t, rows.Err())
			require.Len(t, starts, 10)
			for i, at := range starts {
				allowed := 5 + int((at.Sub(starts[0])+time.Millisecond)/(100*time.Millisecond))
				require.LessOrEqual(t, i+1, allowed, "start %d at +%s: more than the bucket allows", i+1, at.Sub(starts[0]))
			}
			require.GreaterOrEqual(t, starts[9].Sub(starts[0]), 500*time.Millisecond-time.Millisecond)
			require.Less(t, starts[9].Sub(starts[0]), 10*time.Second, "woken by the tokens' times, not the poll interval")
		})
	}
}
