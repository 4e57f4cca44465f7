package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// wait bounds every wait for a state a working worker reaches in about a second: generous, for a loaded machine.
const wait = 30 * time.Second

// caseCompletes: a DAG of `noop` steps completes, each output is the step's input, each step is started once
// and only after its parent completed.
func caseCompletes(c *caseEnv) {
	t := c.t
	input := map[string]any{"hello": "world", "n": []any{1, 2.5, nil}, "nested": map[string]any{"ok": true}}
	task := c.createTask(map[string]any{"name": "conformance", "steps": []any{
		map[string]any{"name": "a", "handler": "noop", "input": input},
		map[string]any{"name": "b", "handler": "noop", "input": map[string]any{"after": "a"}, "depends_on": []string{"a"}},
	}})
	c.start(nil)
	b := c.waitStep(task, "b", wait, "complete")
	a := c.step(task, "a")
	require.Equal(t, "complete", a.State)
	want, err := json.Marshal(input)
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(a.Output))
	require.JSONEq(t, `{"after": "a"}`, string(b.Output))
	for _, s := range []stepState{a, b} {
		require.Equal(t, 1, s.Attempts)
		require.Nil(t, s.LeaseOwner, "a completed step holds no lease")
		require.Len(t, c.eventsNamed(s.ID, "attempt.started"), 1)
		require.Len(t, c.eventsNamed(s.ID, "attempt.succeeded"), 1)
	}
	aDone := c.eventsNamed(a.ID, "step.completed")[0].At
	require.False(t, c.eventsNamed(b.ID, "attempt.started")[0].At.Before(aDone), "b started before a completed")
	var status string
	require.NoError(t, c.pool.QueryRow(context.Background(), `SELECT status FROM stepready.tasks WHERE id = $1`, task).Scan(&status))
	require.Equal(t, "complete", status)
}

// caseWakesOnNotification: with a 30 s poll, a task created by plain SQL while the worker idles is started within
// seconds: writing transactions send no NOTIFY (docs/workers.md, "Waking up"), so the worker reads the wake-up
// counter (wake_count) every probe interval, besides LISTENing on stepready_ready for the NOTIFY that the Go
// library sends after its commits.
func caseWakesOnNotification(c *caseEnv) {
	first := c.createTask(map[string]any{"name": "first", "steps": []any{map[string]any{"name": "a", "handler": "noop"}}})
	c.start(nil)
	c.waitStep(first, "a", wait, "complete") // the worker is up and has made its first claims
	created := time.Now()
	second := c.createTask(map[string]any{"name": "second", "steps": []any{map[string]any{"name": "a", "handler": "noop"}}})
	c.waitStep(second, "a", wait, "complete")
	require.Less(c.t, time.Since(created), 10*time.Second,
		"the step waited for the poll (30 s) instead of the wake-up")
}

// caseRetriesWithBackoff: `fail` fails twice, then succeeds. Each failure is recorded with its class, the retry
// is scheduled by the step's policy (exponential 400 ms × 2, no jitter) and the next attempt starts when it is
// due, not at the next poll (30 s).
func caseRetriesWithBackoff(c *caseEnv) {
	t := c.t
	task := c.createTask(map[string]any{"name": "retries", "steps": []any{map[string]any{
		"name": "a", "handler": "fail", "input": map[string]any{"times": 2, "message": "flaky"},
		"retry": map[string]any{"max_attempts": 5, "backoff": "exponential", "base_delay_ms": 400,
			"multiplier": 2, "jitter": 0},
	}}})
	c.start(nil)
	s := c.waitStep(task, "a", wait, "complete")
	require.Equal(t, 3, s.Attempts)
	require.JSONEq(t, `{"attempts": 3}`, string(s.Output))

	retries := c.eventsNamed(s.ID, "retry.scheduled")
	starts := c.eventsNamed(s.ID, "attempt.started")
	require.Len(t, retries, 2)
	require.Len(t, starts, 3)
	for i, delay := range []time.Duration{400 * time.Millisecond, 800 * time.Millisecond} {
		r := retries[i]
		require.Equal(t, "transient", r.Details["class"])
		require.Equal(t, "flaky", r.Details["error"].(map[string]any)["message"])
		next, err := time.Parse(time.RFC3339Nano, r.Details["next_attempt_at"].(string))
		require.NoError(t, err)
		require.Equal(t, delay, next.Sub(r.At), "retry %d: next_attempt_at is the failure + the policy's delay", i+1)
		require.False(t, starts[i+1].At.Before(next), "attempt %d started before its backoff ended", i+2)
		require.Less(t, starts[i+1].At.Sub(next), 10*time.Second, "attempt %d waited for the poll", i+2)
	}
}

// caseRetryAfter: a handler's requested delay (retry_after_ms) is used exactly, with no jitter and no cap,
// instead of the policy's backoff (a minute here).
func caseRetryAfter(c *caseEnv) {
	t := c.t
	task := c.createTask(map[string]any{"name": "retry-after", "steps": []any{map[string]any{
		"name": "a", "handler": "fail", "input": map[string]any{"times": 1, "class": "rate_limited", "retry_after_ms": 600},
		"retry": map[string]any{"backoff": "fixed", "base_delay_ms": 60000, "jitter": 0.5},
	}}})
	c.start(nil)
	s := c.waitStep(task, "a", wait, "complete")
	require.Equal(t, 2, s.Attempts)
	r := c.eventsNamed(s.ID, "retry.scheduled")
	require.Len(t, r, 1)
	require.Equal(t, "rate_limited", r[0].Details["class"])
	next, err := time.Parse(time.RFC3339Nano, r[0].Details["next_attempt_at"].(string))
	require.NoError(t, err)
	require.Equal(t, 600*time.Millisecond, next.Sub(r[0].At))
}

// casePermanentFailure: a `permanent` failure ends the step at once, attempts left or not, and fails the task.
func casePermanentFailure(c *caseEnv) {
	t := c.t
	task := c.createTask(map[string]any{"name": "permanent", "steps": []any{map[string]any{
		"name": "a", "handler": "fail", "input": map[string]any{"times": 9, "class": "permanent", "message": "no such object"},
		"retry": map[string]any{"max_attempts": 5},
	}}})
	c.start(nil)
	s := c.waitStep(task, "a", wait, "error")
	require.Equal(t, 1, s.Attempts)
	require.Equal(t, "permanent", s.LastError["class"])
	require.Equal(t, "not_retryable", s.LastError["reason"])
	require.Equal(t, "no such object", s.LastError["message"])
	require.Len(t, c.eventsNamed(s.ID, "attempt.started"), 1)
	var status string
	require.NoError(t, c.pool.QueryRow(context.Background(), `SELECT status FROM stepready.tasks WHERE id = $1`, task).Scan(&status))
	require.Equal(t, "error", status)
}

// caseLateResultAfterReap: the worker is frozen (SIGSTOP) in the middle of an attempt; its lease expires, the
// reaper fails the attempt as stalled and another worker (the suite) starts and holds the next attempt. When the
// worker is thawed (SIGCONT) and finishes its old attempt, it must not overwrite the newer state: its result is
// refused and dropped.
func caseLateResultAfterReap(c *caseEnv) {
	t := c.t
	ctx := context.Background()
	task := c.createTask(map[string]any{"name": "late", "steps": []any{map[string]any{
		"name": "a", "handler": "sleep", "input": map[string]any{"ms": 1500},
		"retry": map[string]any{"backoff": "fixed", "base_delay_ms": 0, "max_attempts": 5},
	}}})
	w := c.start(nil)
	first := c.waitStep(task, "a", wait, "in_progress")

	w.signal(t, syscall.SIGSTOP)
	c.waitFor("the frozen worker's lease to expire", wait, func() bool { return c.step(task, "a").LeaseExpired })
	c.waitFor("the reaper to fail the attempt", wait, func() bool {
		c.exec(`SELECT stepready.reap_expired_leases()`)
		return c.step(task, "a").State != "in_progress"
	})
	reaped := c.step(task, "a")
	require.Equal(t, "stalled", reaped.LastError["class"])

	// The suite, as another worker, starts the next attempt.
	var token int
	c.waitFor("the suite to start the next attempt", wait, func() bool {
		err := c.pool.QueryRow(ctx, `SELECT attempt FROM stepready.claim_and_start_steps(1, 'conformance-suite', 60000)`).Scan(&token)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return true
	})
	require.Greater(t, token, first.Token)

	w.signal(t, syscall.SIGCONT)
	// The thawed worker is working again once it has run a new step; by then its old attempt's sleep has long
	// ended and its result has been sent. The window after it gives a slow report time to arrive, and to be
	// refused.
	marker := c.createTask(map[string]any{"name": "marker", "steps": []any{map[string]any{"name": "m", "handler": "noop"}}})
	c.waitStep(marker, "m", wait, "complete")
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		s := c.step(task, "a")
		require.Equal(t, "in_progress", s.State, "the late result overwrote the newer attempt")
		require.Equal(t, token, s.Token)
		require.NotNil(t, s.LeaseOwner)
		require.Equal(t, "conformance-suite", *s.LeaseOwner)
		require.Nil(t, s.Output)
		<-time.After(50 * time.Millisecond)
	}
	var ok bool
	require.NoError(t, c.pool.QueryRow(ctx, `SELECT stepready.complete_step($1, $2, '{"by": "suite"}')`, reaped.ID, token).Scan(&ok))
	require.True(t, ok, "the newer attempt's own result is accepted")
	done := c.step(task, "a")
	require.Equal(t, "complete", done.State)
	require.JSONEq(t, `{"by": "suite"}`, string(done.Output))
	require.Len(t, c.eventsNamed(done.ID, "attempt.succeeded"), 1)
}

// caseHeartbeatsKeepALongStep: an attempt three times longer than its lease (1 s) completes, never reaped: the
// worker heartbeats. The suite reaps every 100 ms meanwhile, so a missed heartbeat would be caught.
func caseHeartbeatsKeepALongStep(c *caseEnv) {
	t := c.t
	task := c.createTask(map[string]any{"name": "long", "steps": []any{map[string]any{
		"name": "a", "handler": "sleep", "input": map[string]any{"ms": 3000}}}})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				_, _ = c.pool.Exec(context.Background(), `SELECT stepready.reap_expired_leases()`)
			}
		}
	}()
	defer wg.Wait()
	defer close(stop)
	c.start(nil)
	s := c.waitStep(task, "a", wait, "complete", "waiting_for_retry", "error")
	require.Equal(t, "complete", s.State, "last error: %v", s.LastError)
	require.Equal(t, 1, s.Attempts)
	require.JSONEq(t, `{"slept_ms": 3000}`, string(s.Output))
	require.Empty(t, c.eventsNamed(s.ID, "lease.expired"))
}

// caseSIGTERMReleasesUncharged: SIGTERM (with a shutdown grace of 100 ms) makes the worker hand its running attempt
// back uncharged and exit 0; a worker started afterwards runs the step as its attempt 1. (That attempt's
// fencing token is 2: a worker that fenced with the attempt number would have its result refused here.)
func caseSIGTERMReleasesUncharged(c *caseEnv) {
	t := c.t
	task := c.createTask(map[string]any{"name": "sigterm", "steps": []any{map[string]any{
		"name": "a", "handler": "sleep", "input": map[string]any{"ms": 2000}}}})
	w := c.start(nil)
	running := c.waitStep(task, "a", wait, "in_progress")
	require.Equal(t, 1, running.Attempts)

	w.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, w.waitExit(t, wait), "exit status after SIGTERM")
	s := c.step(task, "a")
	require.Equal(t, "pending", s.State)
	require.Equal(t, 0, s.Attempts, "the released attempt is not charged")
	require.Nil(t, s.LeaseOwner)
	released := c.eventsNamed(s.ID, "step.released")
	require.Len(t, released, 1)
	require.Equal(t, true, released[0].Details["uncharged"])

	c.start(nil)
	done := c.waitStep(task, "a", wait, "complete", "error")
	require.Equal(t, "complete", done.State, "last error: %v", done.LastError)
	require.Equal(t, 1, done.Attempts)
	require.Equal(t, 2, done.Token)
	require.JSONEq(t, `{"slept_ms": 2000}`, string(done.Output))
}

// caseCancelledAttemptEndsItsLease: an operator cancels the task of a running attempt. The step is cancelled at
// once but keeps its lease (an orphaned lease: the handler still runs and holds its concurrency slot). The
// worker's next heartbeat is refused; it stops the handler and reports the attempt, which the database refuses,
// ending the lease then and there, long before it expires (lease 3 s here) and the reaper clears it.
func caseCancelledAttemptEndsItsLease(c *caseEnv) {
	t := c.t
	task := c.createTask(map[string]any{"name": "cancelled", "steps": []any{map[string]any{
		"name": "a", "handler": "sleep", "input": map[string]any{"ms": 60000}}}})
	c.start(map[string]string{"STEPREADY_LEASE": "3s"})
	c.waitStep(task, "a", wait, "in_progress")
	c.exec(`SELECT stepready.cancel_task($1, 'conformance')`, task)
	s := c.step(task, "a")
	require.Equal(t, "cancelled", s.State)
	require.NotNil(t, s.LeaseExpiresAt, "the running attempt's lease is left on the step")
	c.waitFor("the worker to end the orphaned lease", wait, func() bool { return c.step(task, "a").LeaseExpiresAt == nil })
	s = c.step(task, "a")
	require.Equal(t, "cancelled", s.State)
	require.Nil(t, s.Output)
	require.Empty(t, c.eventsNamed(s.ID, "lease.expired"),
		"the lease expired and was reaped: the worker did not stop the handler and report when its heartbeat was refused")
}

// caseRules: a step with outcome rules (SPEC §8). A worker that evaluates them (WORKER_RULES=1: the Go daemon)
// applies them: here a rule fails an ok outcome. A worker that does not must fail the step `deterministic`
// saying so, without applying the handler's plain outcome.
func caseRules(c *caseEnv) {
	t := c.t
	task := c.createTask(map[string]any{"name": "rules", "steps": []any{map[string]any{
		"name": "a", "handler": "noop", "input": map[string]any{"x": 1},
		"retry": map[string]any{"max_attempts": 3},
		"rules": []any{map[string]any{"when": "outcome.status == 'ok'", "then": map[string]any{"do": "fail", "message": "judged by rule"}}},
	}}})
	c.start(nil)
	s := c.waitStep(task, "a", wait, "error", "complete")
	require.Equal(t, "error", s.State, "the handler's plain outcome was recorded: the rules were ignored")
	require.Equal(t, 1, s.Attempts)
	require.Equal(t, "not_retryable", s.LastError["reason"])
	if c.spec.rules {
		require.NotNil(t, s.LastError["rule"], "the rule that decided is recorded: %v", s.LastError)
		require.NotEmpty(t, c.eventsNamed(s.ID, "policy.evaluated"))
		return
	}
	require.Equal(t, "deterministic", s.LastError["class"])
	require.Contains(t, s.LastError["message"], "rules", "the failure says why: %v", s.LastError)
	require.Nil(t, s.Output)
}

// caseOtherQueuesAndHandlers: a worker started for queue q1 (STEPREADY_QUEUES) with the three built-in handlers
// never takes a step of another queue, nor one of a handler it lacks (SPEC §21): they stay ready, untouched (no
// claim, no attempt, no failure for want of a handler), while steps of its own queue and handlers run.
func caseOtherQueuesAndHandlers(c *caseEnv) {
	t := c.t
	one := func(name, queue, handler string) int64 {
		step := map[string]any{"name": "a", "handler": handler}
		if queue != "" {
			step["queue"] = queue
		}
		return c.createTask(map[string]any{"name": name, "steps": []any{step}})
	}
	otherQueue := one("other-queue", "q2", "noop")
	defaultQueue := one("default-queue", "", "noop")
	otherHandler := one("other-handler", "q1", "transcode")
	mine := one("mine", "q1", "noop")
	c.start(map[string]string{"STEPREADY_QUEUES": "q1"})
	c.waitStep(mine, "a", wait, "complete")
	// A second step of its own, created after the others: the worker has claimed again since they were ready.
	again := one("mine-again", "q1", "noop")
	c.waitStep(again, "a", wait, "complete")
	for _, task := range []int64{otherQueue, defaultQueue, otherHandler} {
		s := c.step(task, "a")
		require.Equal(t, "pending", s.State, "task %d: a step the worker cannot take stays ready", task)
		require.Zero(t, s.Attempts)
		require.Nil(t, s.LeaseOwner)
		require.Empty(t, c.eventsNamed(s.ID, "step.enqueued"), "task %d: claimed", task)
		require.Empty(t, c.eventsNamed(s.ID, "attempt.started"), "task %d: started", task)
	}
}

// caseDepsArriveResolved: a step whose input references its parent's output and the task's context receives the
// input resolved (noop records it as its output), and a step whose reference names nothing at start is failed
// deterministic by the database without reaching the worker (one attempt, no output, the other steps run).
func caseDepsArriveResolved(c *caseEnv) {
	t := c.t
	task := c.createTask(map[string]any{"name": "deps", "context": map[string]any{"region": "eu"}, "steps": []any{
		map[string]any{"name": "a", "handler": "noop", "input": map[string]any{"files": []any{"x.csv", "y.csv"}}},
		map[string]any{"name": "b", "handler": "noop", "depends_on": []string{"a"}, "input": map[string]any{
			"first": "${deps.a.files.0}", "all": "${deps.a.files}", "where": "${context.region}/${deps.a.files.1}"}},
		map[string]any{"name": "bad", "handler": "noop", "depends_on": []string{"a"}, "on_exhausted": "skip",
			"input": map[string]any{"v": "${deps.a.nope}"}},
	}})
	c.start(nil)
	b := c.waitStep(task, "b", wait, "complete")
	require.JSONEq(t, `{"first": "x.csv", "all": ["x.csv", "y.csv"], "where": "eu/y.csv"}`, string(b.Output))
	bad := c.waitStep(task, "bad", wait, "skipped")
	require.Equal(t, 1, bad.Attempts)
	require.Nil(t, bad.Output)
	require.Equal(t, "deterministic", bad.LastError["class"])
	require.Contains(t, bad.LastError["message"], "${deps.a.nope}")
}

// map_elements_arrive_resolved: a map step fans out into elements the worker takes like steps; each element's input
// arrives with ${element…} and ${index} resolved, and the map step's output is its elements' outputs in element
// order (docs/dataflow.md, "Map steps"). An empty array completes the map at once, without the worker.
func caseMapElementsArriveResolved(c *caseEnv) {
	t := c.t
	task := c.createTask(map[string]any{"name": "fanout", "steps": []any{
		map[string]any{"name": "list", "handler": "noop", "input": map[string]any{
			"photos": []any{map[string]any{"file": "a.jpg"}, map[string]any{"file": "b.jpg"}, map[string]any{"file": "c.jpg"}},
			"none":   []any{}}},
		map[string]any{"name": "resize", "handler": "noop", "depends_on": []string{"list"},
			"input": map[string]any{"photo": "${element.file}", "position": "${index}", "label": "photo ${index}: ${element.file}"},
			"map":   map[string]any{"over": "${deps.list.photos}", "max_in_flight": 2}},
		map[string]any{"name": "empty", "handler": "noop", "depends_on": []string{"list"},
			"input": map[string]any{"v": "${element}"}, "map": map[string]any{"over": "${deps.list.none}"}},
		map[string]any{"name": "join", "handler": "noop", "depends_on": []string{"resize", "empty"},
			"input": map[string]any{"resized": "${deps.resize}", "empty": "${deps.empty}"}},
	}})
	c.start(nil)
	join := c.waitStep(task, "join", wait, "complete")
	require.JSONEq(t, `{"resized": [
		{"photo": "a.jpg", "position": 0, "label": "photo 0: a.jpg"},
		{"photo": "b.jpg", "position": 1, "label": "photo 1: b.jpg"},
		{"photo": "c.jpg", "position": 2, "label": "photo 2: c.jpg"}], "empty": []}`, string(join.Output))
	for i := range 3 {
		e := c.waitStep(task, fmt.Sprintf("resize[%d]", i), wait, "complete")
		require.Equal(t, 1, e.Attempts, "element %d started once", i)
	}
}
