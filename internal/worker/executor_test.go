package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/internal/worker"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

type execBundle struct {
	db   *pgtest.DB
	reg  *steps.Registry
	exec *worker.Executor
}

func execSetup(t *testing.T) *execBundle {
	t.Helper()
	db := pgtest.New(t)
	reg := steps.NewRegistry()
	return &execBundle{db: db, reg: reg, exec: &worker.Executor{Pool: db.Pool, Registry: reg, Worker: "w",
		Lease: 600 * time.Millisecond, AbandonGrace: 100 * time.Millisecond}}
}

// claimOne creates a one-step task and claims it.
func (b *execBundle) claimOne(t *testing.T, handler, extra string) store.ClaimedStep {
	t.Helper()
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `SELECT stepready.create_task(jsonb_build_object('name', 't', 'steps',
		jsonb_build_array(jsonb_build_object('name', 's', 'handler', $1::text) || $2::jsonb)))`, handler, "{"+extra+"}")
	require.NoError(t, err)
	claimed, err := store.ClaimReadySteps(ctx, b.db.Pool, 1, "w", time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	return claimed[0]
}

// runOnce registers handler as "h", runs one attempt of a one-step task whose step definition adds extra, and
// returns the claim and the step's row afterwards.
func (b *execBundle) runOnce(t *testing.T, handler steps.HandlerFunc, extra string) (store.ClaimedStep, stepRow) {
	t.Helper()
	b.reg.MustRegister("h", handler)
	c := b.claimOne(t, "h", extra)
	b.exec.Run(context.Background(), c, time.Now())
	return c, b.row(t, c.StepID)
}

// retryDelay is the delay_ms of the step's retry.scheduled event.
func (b *execBundle) retryDelay(t *testing.T, stepID int64) int64 {
	t.Helper()
	var delay int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT (details ->> 'delay_ms')::bigint
		FROM stepready.step_events WHERE step_id = $1 AND event = 'retry.scheduled'`, stepID).Scan(&delay))
	return delay
}

type stepRow struct {
	State, Class, Message string
	Attempts, Iteration   int
	Output                *string
}

func (b *execBundle) row(t *testing.T, id int64) stepRow {
	t.Helper()
	var r stepRow
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT state, COALESCE(last_error ->> 'class', ''),
		COALESCE(last_error ->> 'message', ''), attempts, iteration, output::text FROM stepready.steps WHERE id = $1`, id).
		Scan(&r.State, &r.Class, &r.Message, &r.Attempts, &r.Iteration, &r.Output))
	return r
}

func TestExecutorOutcomes(t *testing.T) {
	t.Parallel()
	// The handler that ignores its deadline is abandoned, not killed: let it go once the subtests are done so
	// its goroutine does not outlive the package's tests.
	stubborn := make(chan struct{})
	t.Cleanup(func() { close(stubborn) })
	cases := []struct {
		name    string
		extra   string
		handler steps.HandlerFunc
		want    stepRow
	}{
		{"success", ``, func(context.Context, *steps.Step) (any, error) { return map[string]int{"n": 1}, nil },
			stepRow{State: "complete", Attempts: 1, Output: ptr(`{"n": 1}`)}},
		{"nil output", ``, func(context.Context, *steps.Step) (any, error) { return nil, nil },
			stepRow{State: "complete", Attempts: 1, Output: ptr(`null`)}},
		{"plain error is transient", ``, func(context.Context, *steps.Step) (any, error) { return nil, errors.New("flaky") },
			stepRow{State: "waiting_for_retry", Class: "transient", Message: "flaky", Attempts: 1}},
		{"classified", ``, func(context.Context, *steps.Step) (any, error) {
			return nil, steps.Fail(steps.ClassDeterministic, errors.New("bad key"))
		}, stepRow{State: "error", Class: "deterministic", Message: "bad key", Attempts: 1}},
		{"permanent", ``, func(context.Context, *steps.Step) (any, error) { return nil, steps.Permanent(errors.New("no")) },
			stepRow{State: "error", Class: "permanent", Message: "no", Attempts: 1}},
		{"repeat", ``, func(context.Context, *steps.Step) (any, error) {
			return nil, steps.Repeat(map[string]int{"page": 1}, map[string]int{"page": 2}, time.Hour)
		}, stepRow{State: "pending", Attempts: 0, Iteration: 1, Output: ptr(`{"page": 1}`)}},
		{"timeout", `"timeout_ms": 50`, func(ctx context.Context, _ *steps.Step) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, stepRow{State: "waiting_for_retry", Class: "timeout", Message: "context deadline exceeded", Attempts: 1}},
		{"ignores its deadline", `"timeout_ms": 50`, func(context.Context, *steps.Step) (any, error) {
			<-stubborn // ignores its context; let go only when the package's tests end
			return nil, nil
		}, stepRow{State: "waiting_for_retry", Class: "timeout", Message: "handler ignored the end of its context and was abandoned", Attempts: 1}},
		{"panic", ``, func(context.Context, *steps.Step) (any, error) { panic("kaboom") },
			stepRow{State: "error", Class: "permanent", Message: "handler panicked: kaboom", Attempts: 1}},
		{"bad input", ``, func(_ context.Context, s *steps.Step) (any, error) {
			var v struct{ N int }
			return nil, s.DecodeInput(&v)
		}, stepRow{State: "error", Class: "permanent", Attempts: 1}},
		{"negative requested delay", ``, func(context.Context, *steps.Step) (any, error) {
			return nil, steps.FailAfter(steps.ClassRateLimited, errors.New("warehouse busy"), -1500*time.Millisecond)
		}, stepRow{State: "waiting_for_retry", Class: "contract_failure", Attempts: 1,
			Message: "handler requested a negative retry delay (-1.5s); a delay must be >= 0. " +
				"The handler's error (class rate_limited): warehouse busy"}},
		{"negative repeat delay", ``, func(context.Context, *steps.Step) (any, error) {
			return nil, steps.Repeat(map[string]int{"page": 1}, nil, -time.Second)
		}, stepRow{State: "waiting_for_retry", Class: "contract_failure", Attempts: 1,
			Message: "handler requested a negative repeat delay (-1s); a delay must be >= 0"}},
		{"unencodable output", ``, func(context.Context, *steps.Step) (any, error) { return make(chan int), nil },
			stepRow{State: "waiting_for_retry", Class: "contract_failure", Attempts: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := execSetup(t)
			extra := tc.extra
			if tc.name == "bad input" {
				extra = `"input": {"N": "not a number"}`
			}
			_, got := b.runOnce(t, tc.handler, extra)
			if tc.want.Message == "" {
				got.Message = ""
			}
			if tc.want.Output == nil {
				got.Output = nil
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func TestExecutorHeartbeatKeepsALongAttemptAlive(t *testing.T) {
	t.Parallel()
	b := execSetup(t)
	ran := make(chan struct{})
	b.reg.MustRegister("slow", steps.HandlerFunc(func(ctx context.Context, _ *steps.Step) (any, error) {
		close(ran)
		// Three leases long: only heartbeats keep the lease from expiring.
		select {
		case <-time.After(3 * b.exec.Lease):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return "done", nil
	}))
	c := b.claimOne(t, "slow", "")
	go func() {
		<-ran
		// Reap as the attempt runs: nothing is expired, so nothing is reaped.
		deadline := time.Now().Add(3 * b.exec.Lease)
		for time.Now().Before(deadline) {
			n, err := store.ReapExpiredLeases(context.Background(), b.db.Pool, 1000)
			if err != nil || n != 0 {
				t.Errorf("reaper took the attempt: n=%d err=%v", n, err)
				return
			}
			<-time.After(50 * time.Millisecond)
		}
	}()
	b.exec.Run(context.Background(), c, time.Now())
	require.Equal(t, "complete", b.row(t, c.StepID).State)
}

func TestExecutorDropsAnAttemptCancelledWhileRunning(t *testing.T) {
	t.Parallel()
	b := execSetup(t)
	running := make(chan struct{})
	cancelled := make(chan error, 1)
	b.reg.MustRegister("long", steps.HandlerFunc(func(ctx context.Context, _ *steps.Step) (any, error) {
		close(running)
		<-ctx.Done()
		cancelled <- ctx.Err()
		return nil, ctx.Err()
	}))
	c := b.claimOne(t, "long", "")
	go func() {
		<-running
		_, err := b.db.Pool.Exec(context.Background(), `SELECT stepready.cancel_task($1, 'operator')`, c.TaskID)
		if err != nil {
			t.Error(err)
		}
	}()
	b.exec.Run(context.Background(), c, time.Now())
	require.Error(t, <-cancelled, "the refused heartbeat cancels the handler")
	require.Equal(t, "cancelled", b.row(t, c.StepID).State)
}

func TestExecutorReleasesAtShutdown(t *testing.T) {
	t.Parallel()
	b := execSetup(t)
	running := make(chan struct{})
	b.reg.MustRegister("long", steps.HandlerFunc(func(ctx context.Context, _ *steps.Step) (any, error) {
		close(running)
		<-ctx.Done()
		return nil, ctx.Err()
	}))
	c := b.claimOne(t, "long", "")
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { <-running; cancel(steps.ErrShutdown) }()
	b.exec.Run(ctx, c, time.Now())
	got := b.row(t, c.StepID)
	require.Equal(t, "pending", got.State)
	require.Equal(t, 0, got.Attempts, "released uncharged")
}

func TestExecutorSkipsAStepNoLongerEnqueued(t *testing.T) {
	t.Parallel()
	b := execSetup(t)
	calls := 0
	b.reg.MustRegister("h", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) { calls++; return nil, nil }))
	c := b.claimOne(t, "h", "")
	_, err := b.db.Pool.Exec(context.Background(), `SELECT stepready.cancel_task($1)`, c.TaskID)
	require.NoError(t, err)
	b.exec.Run(context.Background(), c, time.Now())
	require.Zero(t, calls)
}

func ptr(s string) *string { return &s }

// SPEC §4: a requested delay must be >= 0. A negative one is recorded as a contract_failure that names the value
// and keeps everything the handler said (class and message in the message, code and HTTP status as they are);
// the retry then follows the step's backoff, not the bad value.
func TestExecutorRecordsANegativeRequestedDelayAsAContractFailure(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		delay time.Duration
		want  string
	}{
		{"negative milliseconds", -250 * time.Millisecond, "(-250ms)"},
		{"less than a millisecond below zero", -time.Nanosecond, "(-1ns)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := execSetup(t)
			b.reg.MustRegister("h", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
				return nil, &steps.Error{Class: "quota_exceeded", Code: "429", HTTPStatus: 429, RetryAfter: &tc.delay,
					Err: errors.New("slow down")}
			}))
			c := b.claimOne(t, "h", `"retry": {"backoff": "fixed", "base_delay_ms": 77, "jitter": 0}`)
			b.exec.Run(context.Background(), c, time.Now())
			var doc map[string]any
			var delay int64
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT s.last_error,
				(SELECT (details ->> 'delay_ms')::bigint FROM stepready.step_events e
				  WHERE e.step_id = s.id AND e.event = 'retry.scheduled')
				FROM stepready.steps s WHERE s.id = $1`, c.StepID).Scan(&doc, &delay))
			require.Equal(t, "contract_failure", doc["class"])
			require.Equal(t, "handler requested a negative retry delay "+tc.want+"; a delay must be >= 0. "+
				"The handler's error (class quota_exceeded): slow down", doc["message"])
			require.Equal(t, "429", doc["code"])
			require.Equal(t, float64(429), doc["http_status"])
			require.NotContains(t, doc, "retry_after_ms", "the bad value is not used")
			require.Equal(t, int64(77), delay, "the step's own backoff")
		})
	}
}

// TestExecutorOutputSizeLimit: an output of exactly MaxOutputBytes (encoded) is recorded; one byte more fails the
// attempt as contract_failure naming both sizes; the limit covers a repetition's output too (SPEC §17).
func TestExecutorOutputSizeLimit(t *testing.T) {
	t.Parallel()
	const limit = 100
	// A JSON string of n bytes in all: the quotes and n-2 letters.
	output := func(n int) json.RawMessage { return json.RawMessage(`"` + strings.Repeat("x", n-2) + `"`) }
	for _, tc := range []struct {
		name    string
		handler steps.HandlerFunc
		state   string
		message string
	}{
		{"at the limit", func(context.Context, *steps.Step) (any, error) { return output(limit), nil }, "complete", ""},
		{"one byte over", func(context.Context, *steps.Step) (any, error) { return output(limit + 1), nil }, "waiting_for_retry",
			"handler output is 101 bytes, over the limit of 100 bytes (--max-output-bytes)"},
		{"a repetition's output over", func(context.Context, *steps.Step) (any, error) {
			return nil, steps.Repeat(output(limit+1), nil, 0)
		}, "waiting_for_retry", "handler output is 101 bytes, over the limit of 100 bytes (--max-output-bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := execSetup(t)
			b.exec.MaxOutputBytes = limit
			_, got := b.runOnce(t, tc.handler, "")
			require.Equal(t, tc.state, got.State)
			if tc.message != "" {
				require.Equal(t, "contract_failure", got.Class)
				require.Equal(t, tc.message, got.Message)
			}
		})
	}
}

// Issue 27 finding 3: attempts that finish together are recorded in one batch; an outcome the database refuses for
// its content (a number beyond numeric's range) does not fail the others, and is itself recorded at once as a
// contract_failure with the database's message, not left to its lease. Both ways the executor hands outcomes to
// the batch recorder: waiting for the record (Run, the River dispatcher's) and queued (RunStarted with a recorded
// callback, the direct dispatcher's).
func TestExecutorRecordsARefusedOutcomeOfABatchAsAContractFailure(t *testing.T) {
	t.Parallel()
	for _, queued := range []bool{false, true} {
		t.Run(fmt.Sprintf("queued=%t", queued), func(t *testing.T) {
			t.Parallel()
			b := execSetup(t)
			ctx := context.Background()
			b.exec.Recorder = worker.NewBatchRecorder(b.db.Pool, 0, nil)
			release := make(chan struct{})
			b.reg.MustRegister("h", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
				<-release // every attempt finishes at once: their outcomes meet in a batch
				if s.Name == "bad" {
					return json.RawMessage(`{"n": 1e1000000}`), nil
				}
				return map[string]string{"step": s.Name}, nil
			}))
			const n = 8
			for i := range n {
				name := fmt.Sprintf("ok%d", i)
				if i == 3 {
					name = "bad"
				}
				_, err := b.db.Pool.Exec(ctx, `SELECT stepready.create_task(jsonb_build_object('name', 't', 'steps',
					jsonb_build_array(jsonb_build_object('name', $1::text, 'handler', 'h'))))`, name)
				require.NoError(t, err)
			}
			claimed, err := store.ClaimAndStartSteps(ctx, b.db.Pool, n, "w", time.Minute)
			require.NoError(t, err)
			require.Len(t, claimed, n)
			b.exec.Reserve(n)
			var wg sync.WaitGroup
			var recorded sync.WaitGroup
			for _, c := range claimed {
				wg.Add(1)
				var done func()
				if queued {
					recorded.Add(1)
					done = recorded.Done
				}
				go func() {
					defer wg.Done()
					b.exec.RunStarted(ctx, c.ClaimedStep, c.Started, nil, done)
				}()
			}
			close(release)
			wg.Wait()
			recorded.Wait()
			b.exec.Recorder.Stop()

			var complete, refused int
			var msg string
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM stepready.steps WHERE state = 'complete'),
				(SELECT count(*) FROM stepready.steps WHERE name = 'bad' AND state = 'waiting_for_retry'
				    AND attempts = 1 AND last_error ->> 'class' = 'contract_failure'),
				(SELECT last_error ->> 'message' FROM stepready.steps WHERE name = 'bad')`).Scan(&complete, &refused, &msg))
			require.Equal(t, n-1, complete, "the rest of the batch is recorded")
			require.Equal(t, 1, refused, "the refused outcome is a contract_failure at once")
			require.Contains(t, msg, "value overflows numeric format")
			require.Contains(t, msg, "[SQLSTATE 22003]")
		})
	}
}
