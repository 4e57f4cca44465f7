package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// signalDefinition is the task of the signal tests: charge, then a wait for the signal "approved" (an hour at
// most), then a short sleep, then ship (%s: charge's handler), which receives the signal's payload through deps; and beside them a wait
// that times out and continues.
const signalDefinition = `{"name": "refund", "steps": [
	{"name": "charge", "handler": "%s"},
	{"name": "approve", "depends_on": ["charge"], "wait": {"signal": "approved", "timeout_ms": 3600000}},
	{"name": "nap", "depends_on": ["approve"], "wait": {"duration_ms": 300}},
	{"name": "ship", "handler": "record", "depends_on": ["approve", "nap"],
	 "input": {"by": "${deps.approve.by}", "note": "${deps.approve.note}"}},
	{"name": "reminder", "wait": {"signal": "never", "timeout_ms": 200, "on_timeout": "continue"}},
	{"name": "after_reminder", "handler": "record", "depends_on": ["reminder"]}]}`

// clientPool is a pool logged in as a role with only stepready_client (SPEC §20: clients may send signals).
func clientPool(t *testing.T, b *bundle) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), b.db.LoginRole(t, "stepready_client"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// waitNamedStep polls the state of step name of task taskID until it is want.
func (b *bundle) waitNamedStep(t *testing.T, taskID int64, name, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var state string
	for {
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT state FROM stepready.steps WHERE task_id = $1 AND name = $2`, taskID, name).Scan(&state))
		if state == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %d step %s: state %q after %s, want %q", taskID, name, state, timeout, want)
		}
		<-time.After(10 * time.Millisecond)
	}
}

// Issue 22, SPEC §20, end to end in both dispatch modes: a wait step waits (no worker runs it) until the signal
// sent through stepready.SendSignal (by a client role) completes it, the sleep after it ends on the daemon's timer
// (its poll is a minute away), and the dependent's handler receives the payload through deps and its input; a
// wait that times out with on_timeout continue completes with output null. The signal is sent once while the
// step waits, and once, on a second task, before its parents finished (buffered, consumed when it starts
// waiting).
func TestSignalsEndToEnd(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			var mu sync.Mutex
			got := map[string]json.RawMessage{} // "task/step" → what the handler received as deps
			inputs := map[string]json.RawMessage{}
			release := make(chan struct{})
			record := func(_ context.Context, s *steps.Step) (any, error) {
				mu.Lock()
				defer mu.Unlock()
				key := fmt.Sprintf("%d/%s", s.TaskID, s.Name)
				got[key], inputs[key] = s.Deps, s.Input
				return map[string]any{"done": s.Name}, nil
			}
			b.reg.MustRegister("record", steps.HandlerFunc(record))
			// hold runs until the test releases it: the signal sent meanwhile finds no step waiting yet.
			b.reg.MustRegister("hold", steps.HandlerFunc(func(ctx context.Context, s *steps.Step) (any, error) {
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return record(ctx, s)
			}))
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: time.Minute})
			client := clientPool(t, b)
			waitingID := b.createTask(t, fmt.Sprintf(signalDefinition, "record"))
			bufferedID := b.createTask(t, fmt.Sprintf(signalDefinition, "hold"))

			// Sent while the step waits.
			b.waitNamedStep(t, waitingID, "approve", "waiting", 30*time.Second)
			id1, err := stepready.SendSignal(ctx, client, waitingID, "approved",
				json.RawMessage(`{"by": "ada", "note": "quotes \" and unicode é ✓"}`), stepready.SignalOptions{})
			require.NoError(t, err)

			// Sent before the parents finished: charge still runs, so approve is pending and the signal waits
			// in the mailbox.
			b.waitNamedStep(t, bufferedID, "charge", "in_progress", 30*time.Second)
			id2, err := stepready.SendSignal(ctx, client, bufferedID, "approved",
				json.RawMessage(`{"by": "grace", "note": "early"}`), stepready.SignalOptions{IdempotencyKey: "k1"})
			require.NoError(t, err)
			var consumedBy *int64
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT consumed_by FROM stepready.signals WHERE id = $1`, id2).
				Scan(&consumedBy))
			require.Nil(t, consumedBy, "buffered: no step waits yet")
			again, err := stepready.SendSignal(ctx, client, bufferedID, "approved",
				json.RawMessage(`{"by": "someone else"}`), stepready.SignalOptions{IdempotencyKey: "k1"})
			require.NoError(t, err)
			require.Equal(t, id2, again, "a repeated idempotency key answers the first signal's id")
			close(release)

			for _, id := range []int64{waitingID, bufferedID} {
				require.Equal(t, "complete", b.waitTask(t, id, 30*time.Second, "complete", "error", "cancelled"))
			}
			mu.Lock()
			defer mu.Unlock()
			for id, who := range map[int64]string{waitingID: "ada", bufferedID: "grace"} {
				ship := fmt.Sprintf("%d/ship", id)
				var deps struct {
					Approve struct {
						By string `json:"by"`
					} `json:"approve"`
					Nap struct {
						SleptUntil string `json:"slept_until"`
					} `json:"nap"`
				}
				require.NoError(t, json.Unmarshal(got[ship], &deps), "ship's deps: %s", got[ship])
				require.Equal(t, who, deps.Approve.By, "the signal's payload is the wait step's output")
				require.NotEmpty(t, deps.Nap.SleptUntil, "a sleep completes with slept_until")
				var in struct {
					By string `json:"by"`
				}
				require.NoError(t, json.Unmarshal(inputs[ship], &in))
				require.Equal(t, who, in.By, "${deps.approve.by} resolved in ship's input")
				require.JSONEq(t, `{"reminder": null}`, string(got[fmt.Sprintf("%d/after_reminder", id)]),
					"a wait that timed out with on_timeout continue completes with output null")
			}
			require.JSONEq(t, `{"by": "ada", "note": "quotes \" and unicode é ✓"}`,
				string(outputOf(t, b, waitingID, "approve")))

			// Each signal was consumed by its task's approve step, once; no worker ever ran a wait step.
			var consumed, started int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM stepready.signals g JOIN stepready.steps s ON s.id = g.consumed_by
				  WHERE g.id IN ($1, $2) AND s.name = 'approve' AND s.task_id = g.task_id),
				(SELECT count(*) FROM stepready.step_events e JOIN stepready.steps s ON s.id = e.step_id
				  WHERE s.task_id IN ($3, $4) AND s.wait IS NOT NULL AND e.event = 'attempt.started')`,
				id1, id2, waitingID, bufferedID).Scan(&consumed, &started))
			require.Equal(t, 2, consumed)
			require.Zero(t, started, "a wait step is never claimed nor started by a worker")
		})
	}
}

// outputOf returns the output of step name of task taskID.
func outputOf(t *testing.T, b *bundle, taskID int64, name string) json.RawMessage {
	t.Helper()
	var out json.RawMessage
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT output FROM stepready.steps WHERE task_id = $1 AND name = $2`, taskID, name).Scan(&out))
	return out
}

// Two daemons (one of each dispatch mode) and eight senders at once: every waiting task completes once, each
// dependent runs exactly once with its own task's payload, and no signal is consumed twice.
func TestSignalsTwoDaemons(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const tasks = 40
	var mu sync.Mutex
	runs := map[int64][]string{}
	b.reg.MustRegister("record", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
		var in struct {
			By string `json:"by"`
		}
		if err := json.Unmarshal(s.Input, &in); err != nil {
			return nil, err
		}
		mu.Lock()
		runs[s.TaskID] = append(runs[s.TaskID], in.By)
		mu.Unlock()
		return nil, nil
	}))
	b.start(t, stepready.Config{Dispatch: stepready.DispatchDirect, WorkerID: "one", PollInterval: time.Minute})
	b.start(t, stepready.Config{Dispatch: stepready.DispatchRiver, WorkerID: "two", PollInterval: time.Minute})
	client := clientPool(t, b)

	ids := make([]int64, tasks)
	for i := range ids {
		ids[i] = b.createTask(t, `{"name": "pair", "steps": [
			{"name": "approve", "wait": {"signal": "go"}},
			{"name": "after", "handler": "record", "depends_on": ["approve"], "input": {"by": "${deps.approve.by}"}}]}`)
	}
	var wg sync.WaitGroup
	errs := make(chan error, tasks)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < tasks; i += 8 {
				// Every sender sends each of its tasks' signals twice under one key: the second is a no-op.
				for range 2 {
					_, err := stepready.SendSignal(ctx, client, ids[i], "go",
						json.RawMessage(fmt.Sprintf(`{"by": "task-%d"}`, ids[i])),
						stepready.SignalOptions{IdempotencyKey: "once"})
					if err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, id := range ids {
		require.Equal(t, "complete", b.waitTask(t, id, 30*time.Second, "complete", "error", "cancelled"))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		require.Equal(t, []string{fmt.Sprintf("task-%d", id)}, runs[id], "task %d: its dependent ran once, with its payload", id)
	}
	var signals, consumed int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT consumed_by)
		FROM stepready.signals WHERE task_id = ANY($1)`, ids).Scan(&signals, &consumed))
	require.Equal(t, tasks, signals, "one signal per task: the repeats under the key added nothing")
	require.Equal(t, tasks, consumed, "each signal completed its own step")
}
