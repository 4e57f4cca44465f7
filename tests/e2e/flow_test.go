package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/store"
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
			starts := b.claimTimes(t, "api")
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

// flowTracker is a handler that records how many of its attempts run at once; each attempt waits on release
// (closed: return at once) or for 20 ms.
type flowTracker struct {
	mu       sync.Mutex
	running  int
	max      int
	release  chan struct{}
	overlaps int // attempts started after release while another one ran
}

func (f *flowTracker) handler() steps.Handler {
	return steps.HandlerFunc(func(ctx context.Context, s *steps.Step) (any, error) {
		f.mu.Lock()
		f.running++
		f.max = max(f.max, f.running)
		if f.release != nil && f.running > 1 {
			select {
			case <-f.release:
				f.overlaps++
			default:
			}
		}
		f.mu.Unlock()
		defer func() {
			f.mu.Lock()
			f.running--
			f.mu.Unlock()
		}()
		wait := time.After(20 * time.Millisecond)
		if f.release != nil {
			wait = nil
		}
		select {
		case <-f.release:
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return s.Input, nil
	})
}

func (f *flowTracker) maxRunning() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.max
}

// flow-tenant.yaml: two imports of tenant acme never run more than two import steps at once.
func TestPolicyFlowTenant(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			tr := &flowTracker{}
			b := polSetup(t, mode, nil, map[string]steps.Handler{"import": tr.handler()})
			a, c := b.polCreate(t, "flow-tenant.yaml"), b.polCreate(t, "flow-tenant.yaml")
			b.waitTask(t, a, polWait, "complete")
			b.waitTask(t, c, polWait, "complete")
			require.Equal(t, 2, tr.maxRunning(), "at most, and at some point exactly, two import steps at once")
			var key string
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT DISTINCT concurrency_key
				FROM stepready.steps WHERE task_id = $1`, a).Scan(&key))
			require.Equal(t, "tenant:acme", key)
		})
	}
}

// flow-map-hosts.yaml: a map over six files on two hosts whose concurrency key is host:${element.host}, limit 1:
// each element gets its host's key at fan-out, so one fetch per host runs at a time and the hosts run side by
// side.
func TestPolicyFlowMapHosts(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			perHost := map[string]*flowTracker{}
			all := &flowTracker{}
			allHandler := all.handler()
			fetch := steps.HandlerFunc(func(ctx context.Context, s *steps.Step) (any, error) {
				var in struct{ Host string }
				if err := s.DecodeInput(&in); err != nil {
					return nil, err
				}
				mu.Lock()
				tr := perHost[in.Host]
				if tr == nil {
					tr = &flowTracker{}
					perHost[in.Host] = tr
				}
				mu.Unlock()
				// Counted by both trackers while it runs: all's handler waits the 20 ms, the host's returns at once.
				tr.mu.Lock()
				tr.running++
				tr.max = max(tr.max, tr.running)
				tr.mu.Unlock()
				defer func() {
					tr.mu.Lock()
					tr.running--
					tr.mu.Unlock()
				}()
				return allHandler.Handle(ctx, s)
			})
			b := polSetup(t, mode, nil, map[string]steps.Handler{"fetch": fetch})
			id := b.polCreate(t, "flow-map-hosts.yaml")
			b.waitTask(t, id, polWait, "complete")
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, perHost, 2)
			for host, tr := range perHost {
				require.Equal(t, 1, tr.maxRunning(), "host %s: one fetch at a time", host)
			}
			require.Equal(t, 2, all.maxRunning(), "the two hosts side by side at some point")
			rows, err := b.db.Pool.Query(context.Background(), `SELECT concurrency_key FROM stepready.steps
				WHERE task_id = $1 AND map_step_id IS NOT NULL ORDER BY element_index`, id)
			require.NoError(t, err)
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.Equal(t, []string{"host:a.example", "host:a.example", "host:a.example", "host:b.example",
				"host:b.example", "host:b.example"}, keys)
		})
	}
}

// flow-api-rate.yaml: two syncs (eight calls) on one bucket of 5 per second: five at once, then one every 200 ms.
func TestPolicyFlowAPIRate(t *testing.T) {
	t.Parallel()
	b := polSetup(t, stepready.DispatchDirect, nil, nil)
	a, c := b.polCreate(t, "flow-api-rate.yaml"), b.polCreate(t, "flow-api-rate.yaml")
	b.waitTask(t, a, polWait, "complete")
	b.waitTask(t, c, polWait, "complete")
	at := b.claimTimes(t, "api:partner")
	require.Len(t, at, 8)
	for i := 5; i < 8; i++ {
		require.GreaterOrEqual(t, at[i].Sub(at[0]), time.Duration(i-4)*200*time.Millisecond-time.Millisecond,
			"call %d came before its token", i+1)
	}
}

// An operator lowers a tenant's limit while two of its steps run: no new step starts until the key is under
// the new limit, and then at most one runs at a time (`scheduler flow set tenant:acme
// --concurrency 1` is store.SetFlowLimit).
func TestPolicyFlowLoweredLive(t *testing.T) {
	t.Parallel()
	tr := &flowTracker{release: make(chan struct{})}
	b := polSetup(t, stepready.DispatchDirect, nil, map[string]steps.Handler{"import": tr.handler()})
	a, c := b.polCreate(t, "flow-tenant.yaml"), b.polCreate(t, "flow-tenant.yaml")
	inFlight := func() int {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM stepready.steps
			WHERE concurrency_key = 'tenant:acme' AND state IN ('enqueued', 'in_progress')`).Scan(&n))
		return n
	}
	deadline := time.Now().Add(polWait)
	for inFlight() < 2 {
		require.False(t, time.Now().After(deadline), "two imports never started")
		<-time.After(10 * time.Millisecond)
	}
	one := 1
	require.NoError(t, store.SetFlowLimit(context.Background(), b.db.Pool, "tenant:acme",
		store.FlowLimit{Concurrency: &one}))
	close(tr.release)
	b.waitTask(t, a, polWait, "complete")
	b.waitTask(t, c, polWait, "complete")
	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.Equal(t, 2, tr.max, "the two running at the change were the most at any time")
	// A handler returns before its outcome is recorded, so a start after the change while another import runs
	// would be two in flight under a limit of one.
	require.Zero(t, tr.overlaps, "after the change, an import started while another one ran")
}

// claimTimes returns when the steps of a rate key were claimed (their step.enqueued events), in order.
func (b *bundle) claimTimes(t *testing.T, rateKey string) []time.Time {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT e.at FROM stepready.step_events e
		JOIN stepready.steps s ON s.id = e.step_id
		WHERE s.rate_key = $1 AND e.event = 'step.enqueued' ORDER BY e.at`, rateKey)
	require.NoError(t, err)
	at, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	return at
}
