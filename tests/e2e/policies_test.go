package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// The tests below run every example of docs/policies.md (examples/policies/*.yaml, read from the file) through
// the daemon and PostgreSQL, and check attempts, states, reasons, classes and the delays actually recorded.

// polWait is how long a policy example may take to reach its final status.
const polWait = 30 * time.Second

// http-status.yaml: 429/5xx retried exponentially (rule 0), 401/403 failed at once (rule 1), other failures
// retried linearly (rule 2), which cannot revive a class the http built-in calls permanent.
func TestPolicyHTTPStatus(t *testing.T) {
	t.Parallel()
	ok := polResponse{status: 200, body: `{"items": [1, 2, 3]}`}
	cases := []struct {
		name      string
		modes     []string
		script    []polResponse
		status    string // task status
		state     string
		attempts  int
		reason    string
		delays    []int64
		rules     []int // rule_index of each policy.evaluated
		errStatus float64
	}{
		{name: "503, dropped connection, 429, then 200", modes: dispatchModes,
			script: []polResponse{{status: 503}, {drop: true}, {status: 429}, ok},
			status: "complete", state: "complete", attempts: 4,
			delays: []int64{20, 25 * 2, 20 * 4}, rules: []int{0, 2, 0, -1}},
		{name: "5xx until the rule's 6 attempts are spent",
			script: []polResponse{{status: 502}, {status: 500}, {status: 504}, {status: 503}},
			status: "error", state: "error", attempts: 6, reason: "retries_exhausted",
			delays: []int64{20, 40, 80, 160, 320}, rules: []int{0, 0, 0, 0, 0, 0}, errStatus: 503},
		{name: "401 fails at once", script: []polResponse{{status: 401}},
			status: "error", state: "error", attempts: 1, reason: "not_retryable", rules: []int{1}, errStatus: 401},
		{name: "403 fails at once", script: []polResponse{{status: 403}},
			status: "error", state: "error", attempts: 1, reason: "not_retryable", rules: []int{1}, errStatus: 403},
		{name: "404: the retry rule matches but the class is permanent", script: []polResponse{{status: 404}},
			status: "error", state: "error", attempts: 1, reason: "not_retryable", rules: []int{2}, errStatus: 404},
		{name: "network errors: 3 attempts, linear", script: []polResponse{{drop: true}},
			status: "error", state: "error", attempts: 3, reason: "retries_exhausted",
			delays: []int64{25, 50}, rules: []int{2, 2, 2}},
	}
	for _, tc := range cases {
		for _, mode := range cmpOrModes(tc.modes) {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				api := polNewAPI(t, tc.script...)
				b := polSetup(t, mode, api, nil)
				id := b.polCreate(t, "http-status.yaml")
				b.waitTask(t, id, polWait, tc.status)

				st := b.polStep(t, id, "fetch_items")
				require.Equal(t, tc.state, st.State)
				require.Equal(t, tc.attempts, st.Attempts)
				calls, _ := api.requests()
				require.Equal(t, tc.attempts, calls, "one request per attempt")
				b.polRequireSchedule(t, st.ID, tc.delays...)
				require.Equal(t, tc.rules, b.polRuleIndexes(t, st.ID))
				if tc.reason == "" {
					require.JSONEq(t, `[1, 2, 3]`, string(polField(t, st.Output, "body", "items")))
					return
				}
				require.Equal(t, tc.reason, st.LastError["reason"])
				if tc.errStatus != 0 {
					require.Equal(t, tc.errStatus, st.LastError["http_status"])
				}
				lastRule := float64(tc.rules[len(tc.rules)-1])
				require.Equal(t, lastRule, st.LastError["rule"].(map[string]any)["index"], "the deciding rule is recorded")
			})
		}
	}
}

func cmpOrModes(modes []string) []string {
	if len(modes) == 0 {
		return []string{stepready.DispatchDirect}
	}
	return modes
}

// polField digs a value out of a JSON document.
func polField(t *testing.T, doc json.RawMessage, path ...string) json.RawMessage {
	t.Helper()
	for _, p := range path {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(doc, &m), "%s is not an object", doc)
		doc = m[p]
	}
	return doc
}

// polLedgerSQL is the schema postgres-serialization.yaml writes to, with a trigger that raises the SQLSTATE
// listed in billing.faults for the n-th insert (a sequence counts inserts: nextval survives the rollback of the
// failed statement). The handler sees a real *pgconn.PgError with that code.
const polLedgerSQL = `
CREATE SCHEMA billing;
CREATE TABLE billing.ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account text NOT NULL,
                             amount_cents bigint NOT NULL);
CREATE SEQUENCE billing.insert_calls;
CREATE TABLE billing.faults (call bigint PRIMARY KEY, sqlstate text NOT NULL);
CREATE FUNCTION billing.inject_fault() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint := nextval('billing.insert_calls');
    s text;
BEGIN
    SELECT f.sqlstate INTO s FROM billing.faults f WHERE f.call = n;
    IF s IS NOT NULL THEN
        RAISE EXCEPTION 'injected fault on insert %', n USING ERRCODE = s;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER inject_fault BEFORE INSERT ON billing.ledger FOR EACH ROW EXECUTE FUNCTION billing.inject_fault();
-- Step SQL runs on a pool of its own, as a role with no stepready rights (SPEC §17): the application's schema is
-- granted to it here, as an application would.
GRANT USAGE ON SCHEMA billing TO PUBLIC;
GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA billing TO PUBLIC;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA billing TO PUBLIC;`

// postgres-serialization.yaml: 40001 and 40P01 retried exponentially; any other SQLSTATE fails at once, even
// one the sql built-in classifies as transient.
func TestPolicyPostgresSerialization(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		faults   []string // SQLSTATE raised by insert n+1
		status   string
		attempts int
		reason   string
		class    string
		delays   []int64
	}{
		{name: "serialization failure, deadlock, then success", faults: []string{"40001", "40P01"},
			status: "complete", attempts: 3, delays: []int64{20, 40}},
		{name: "deadlocks until 5 attempts are spent", faults: []string{"40P01", "40P01", "40P01", "40P01", "40P01"},
			status: "error", attempts: 5, reason: "retries_exhausted", class: "transient", delays: []int64{20, 40, 80, 160}},
		{name: "unique violation fails at once", faults: []string{"23505"},
			status: "error", attempts: 1, reason: "not_retryable", class: "permanent"},
		{name: "lock_not_available fails at once although the built-in calls it transient", faults: []string{"55P03"},
			status: "error", attempts: 1, reason: "not_retryable", class: "transient"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := polSetup(t, stepready.DispatchDirect, nil, nil)
			ctx := context.Background()
			_, err := b.db.Pool.Exec(ctx, polLedgerSQL)
			require.NoError(t, err)
			for i, code := range tc.faults {
				_, err := b.db.Pool.Exec(ctx, `INSERT INTO billing.faults VALUES ($1, $2)`, i+1, code)
				require.NoError(t, err)
			}

			id := b.polCreate(t, "postgres-serialization.yaml")
			b.waitTask(t, id, polWait, tc.status)
			st := b.polStep(t, id, "insert_ledger_row")
			require.Equal(t, tc.status, st.State)
			require.Equal(t, tc.attempts, st.Attempts)
			b.polRequireSchedule(t, st.ID, tc.delays...)

			var rows int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM billing.ledger`).Scan(&rows))
			if tc.reason == "" {
				require.Equal(t, 1, rows, "exactly one row written")
				var ledgerID int64
				require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT id FROM billing.ledger`).Scan(&ledgerID))
				require.JSONEq(t, fmt.Sprintf(`{"rows": [{"id": %d}], "rows_affected": 1}`, ledgerID), string(st.Output))
				return
			}
			require.Zero(t, rows)
			require.Equal(t, tc.reason, st.LastError["reason"])
			require.Equal(t, tc.class, st.LastError["class"])
			require.Equal(t, tc.faults[len(tc.faults)-1], st.LastError["code"], "outcome.error.code is the SQLSTATE")
		})
	}
}

// timeout-message.yaml: a message mentioning a timeout (any case) or an attempt cut by the step's deadline is
// retried linearly; anything else fails at once.
func TestPolicyTimeoutMessage(t *testing.T) {
	t.Parallel()
	deadline := errors.New("block until the deadline")
	cases := []struct {
		name     string
		script   []error
		status   string
		attempts int
		reason   string
		class    string
		delays   []int64
	}{
		{name: "two timeout messages, then success",
			script: []error{errors.New("read Timeout after 5s"), errors.New("model server: UPSTREAM TIMEOUT")},
			status: "complete", attempts: 3, delays: []int64{20, 40}},
		{name: "the step's deadline, then success", script: []error{deadline},
			status: "complete", attempts: 2, delays: []int64{20}},
		{name: "timeouts until 4 attempts are spent", script: []error{
			errors.New("socket timeout"), errors.New("socket timeout"), errors.New("socket timeout"), errors.New("socket timeout")},
			status: "error", attempts: 4, reason: "retries_exhausted", class: "transient", delays: []int64{20, 40, 60}},
		{name: "another error fails at once", script: []error{errors.New(`unexpected column "price" in batch 7`)},
			status: "error", attempts: 1, reason: "not_retryable", class: "transient"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			handler := steps.HandlerFunc(func(ctx context.Context, s *steps.Step) (any, error) {
				if s.Attempt > len(tc.script) {
					return map[string]any{"rows": 120}, nil
				}
				if err := tc.script[s.Attempt-1]; err != deadline {
					return nil, err
				}
				<-ctx.Done()
				return nil, ctx.Err()
			})
			b := polSetup(t, stepready.DispatchDirect, nil, map[string]steps.Handler{"transform": handler})
			id := b.polCreate(t, "timeout-message.yaml")
			b.waitTask(t, id, polWait, tc.status)
			st := b.polStep(t, id, "transform")
			require.Equal(t, tc.status, st.State)
			require.Equal(t, tc.attempts, st.Attempts)
			retries := b.polRequireSchedule(t, st.ID, tc.delays...)
			if tc.script[0] == deadline {
				require.Equal(t, "timeout", retries[0].Details["class"], "the deadline's class")
			}
			if tc.reason != "" {
				require.Equal(t, tc.reason, st.LastError["reason"])
				require.Equal(t, tc.class, st.LastError["class"])
			}
		})
	}
}

// polPolicy is the materialized policy of a step.
type polPolicy struct {
	Preset      *string
	MaxAttempts int
	Retryable   bool
	Backoff     string
	BaseDelayMS int64
	Multiplier  float64
	MaxDelayMS  *int64
	Jitter      float64
}

func (b *bundle) polPolicies(t *testing.T, taskID int64) map[string]polPolicy {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `
		SELECT name, retry_policy, max_attempts, retryable, backoff, base_delay_ms, multiplier, max_delay_ms, jitter
		  FROM stepready.steps WHERE task_id = $1`, taskID)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]polPolicy{}
	for rows.Next() {
		var name string
		var p polPolicy
		require.NoError(t, rows.Scan(&name, &p.Preset, &p.MaxAttempts, &p.Retryable, &p.Backoff, &p.BaseDelayMS,
			&p.Multiplier, &p.MaxDelayMS, &p.Jitter))
		out[name] = p
	}
	require.NoError(t, rows.Err())
	return out
}

func polPtr[T any](v T) *T { return &v }

// presets.yaml: each step gets its preset, explicit fields win over the preset, and the retries of `fetch`
// follow aggressive's schedule.
func TestPolicyPresets(t *testing.T) {
	t.Parallel()
	b := polSetup(t, stepready.DispatchDirect, nil, nil)
	id := b.polCreate(t, "presets.yaml")
	require.Equal(t, map[string]polPolicy{
		"fetch":   {polPtr("aggressive"), 5, true, "exponential", 200, 2, polPtr[int64](30000), 0},
		"build":   {polPtr("standard"), 5, true, "exponential", 1000, 2, polPtr[int64](30000), 0},
		"analyze": {polPtr("patient"), 3, true, "exponential", 5000, 3, polPtr[int64](60000), 0},
		"publish": {polPtr("none"), 1, false, "fixed", 0, 1, polPtr[int64](0), 0},
	}, b.polPolicies(t, id))

	b.waitTask(t, id, polWait, "complete")
	st := b.polStep(t, id, "fetch")
	require.Equal(t, 3, st.Attempts)
	b.polRequireSchedule(t, st.ID, 200, 400)
	for _, name := range []string{"build", "analyze", "publish"} {
		require.Equal(t, 1, b.polStep(t, id, name).Attempts, name)
	}
}

// workflow-default.yaml: the task's retry is every step's default; a step's own fields override it one by one,
// and a step preset beats the task's explicit fields.
func TestPolicyWorkflowDefault(t *testing.T) {
	t.Parallel()
	b := polSetup(t, stepready.DispatchDirect, nil, nil)
	id := b.polCreate(t, "workflow-default.yaml")
	require.Equal(t, map[string]polPolicy{
		"extract": {polPtr("aggressive"), 3, true, "exponential", 200, 2, polPtr[int64](30000), 0},
		"load":    {polPtr("aggressive"), 3, true, "fixed", 50, 2, polPtr[int64](30000), 0},
		"enrich":  {polPtr("aggressive"), 3, true, "exponential", 20, 2, polPtr[int64](30000), 0},
		"notify":  {polPtr("none"), 1, false, "fixed", 0, 1, polPtr[int64](0), 0},
	}, b.polPolicies(t, id))

	b.waitTask(t, id, polWait, "complete")
	extract := b.polStep(t, id, "extract")
	require.Equal(t, "complete", extract.State)
	require.Equal(t, 3, extract.Attempts)
	b.polRequireSchedule(t, extract.ID, 200, 400)

	load := b.polStep(t, id, "load")
	require.Equal(t, "complete", load.State)
	require.Equal(t, 3, load.Attempts)
	b.polRequireSchedule(t, load.ID, 50, 50)

	enrich := b.polStep(t, id, "enrich")
	require.Equal(t, "skipped", enrich.State)
	require.Equal(t, 3, enrich.Attempts, "the task's max_attempts")
	require.Equal(t, "retries_exhausted", enrich.LastError["reason"])
	require.Equal(t, "geocoder unavailable", enrich.LastError["message"])
	b.polRequireSchedule(t, enrich.ID, 20, 40)

	notify := b.polStep(t, id, "notify")
	require.Equal(t, "complete", notify.State)
	require.Equal(t, 1, notify.Attempts)
}

// polQuotaClassSQL adds the failure class of failure-classes.yaml. docs/policies.md shows this exact statement
// (TestPoliciesDocMatchesExamples checks it).
const polQuotaClassSQL = `INSERT INTO stepready.failure_classes (name, retryable, breaker)
VALUES ('quota_exceeded', true, true);`

// failure-classes.yaml: a class added as data (no code change) with breaker = true opens the circuit after
// breaker_limit identical failures in a row, where messages differing only in digits and hex runs are
// identical, and anything else in between starts the count again.
func TestPolicyFailureClassesAndBreaker(t *testing.T) {
	t.Parallel()
	quota := func(key string, calls int, request string) error {
		return steps.Fail("quota_exceeded", fmt.Errorf("quota exceeded for key %s: %d of 1000 calls today (request %s)",
			key, calls, request))
	}
	same := quota("7f3a9c", 1204, "deadbeef")
	other := steps.Fail("quota_exceeded", errors.New("quota exceeded: partner suspended the account"))
	reset := steps.Fail(steps.ClassTransient, errors.New("connection reset by peer"))
	cases := []struct {
		name     string
		script   []error
		state    string
		attempts int
		counts   []int // breaker_count of each failure (0: the class does not count)
		// fingerprint, when set, is the fingerprint every failure must have.
		fingerprint string
	}{
		{name: "identical message three times", script: []error{same, same, same},
			state: "error", attempts: 3, counts: []int{1, 2, 3}},
		{name: "messages differing only in digits and hex", script: []error{
			quota("7f3a9c", 1204, "deadbeef"), quota("7f3a9c", 1377, "cafebabe"), quota("0b41e2", 99, "abcdefab")},
			state: "error", attempts: 3, counts: []int{1, 2, 3},
			fingerprint: "quota_exceeded:quota exceeded for key #: # of # calls today (request #)"},
		{name: "two identical, then success", script: []error{same, same},
			state: "complete", attempts: 3, counts: []int{1, 2}},
		{name: "a different message resets the streak", script: []error{same, same, other, same, same, same},
			state: "error", attempts: 6, counts: []int{1, 2, 1, 1, 2, 3}},
		{name: "another class resets the streak", script: []error{same, same, reset, same, same, same},
			state: "error", attempts: 6, counts: []int{1, 2, 0, 1, 2, 3}},
		{name: "alternating messages never trip it", script: []error{same, other, same, other, same},
			state: "complete", attempts: 6, counts: []int{1, 1, 1, 1, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := polSetup(t, stepready.DispatchDirect, nil, map[string]steps.Handler{"partner_push": polScript(tc.script...)})
			_, err := b.db.Pool.Exec(context.Background(), polQuotaClassSQL)
			require.NoError(t, err)

			id := b.polCreate(t, "failure-classes.yaml")
			b.waitTask(t, id, polWait, tc.state) // the task's status is the step's state here
			st := b.polStep(t, id, "push_orders")
			require.Equal(t, tc.state, st.State)
			require.Equal(t, tc.attempts, st.Attempts, "10 attempts were allowed")

			failures := b.polEventDetails(t, st.ID, "attempt.failed")
			require.Len(t, failures, len(tc.counts))
			var fingerprint any
			for i, d := range failures {
				count := 0
				if c, ok := d["breaker_count"]; ok {
					count = int(c.(float64))
				}
				require.Equal(t, tc.counts[i], count, "failure %d: breaker_count", i+1)
				switch {
				case count > 1:
					require.Equal(t, fingerprint, d["fingerprint"], "failure %d: the previous fingerprint", i+1)
				case count == 1 && fingerprint != nil:
					require.NotEqual(t, fingerprint, d["fingerprint"], "failure %d: a new fingerprint", i+1)
				}
				if tc.fingerprint != "" {
					require.Equal(t, tc.fingerprint, d["fingerprint"], "failure %d", i+1)
				}
				fingerprint = d["fingerprint"]
			}
			// Every failure but a final one was retried after the fixed 20 ms.
			delays := make([]int64, len(tc.counts))
			for i := range delays {
				delays[i] = 20
			}
			if tc.state == "error" {
				delays = delays[:len(delays)-1]
				require.Equal(t, "circuit_open", st.LastError["reason"])
				require.Equal(t, "quota_exceeded", st.LastError["class"])
			}
			b.polRequireSchedule(t, st.ID, delays...)
		})
	}
}

// retry-after.yaml: a Retry-After header (seconds or HTTP date) and steps.FailAfter set next_attempt_at to the
// failure's database time plus exactly the requested delay, though the steps have jitter 0.5 and a 100 ms cap,
// and the next attempt does not start before it.
func TestPolicyRetryAfterIsHonouredExactly(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		retryAfter func() string
	}{
		{name: "seconds", retryAfter: func() string { return "1" }},
		{name: "HTTP date", retryAfter: func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			api := polNewAPI(t, polResponse{status: 429, retryAfter: tc.retryAfter}, polResponse{status: 200, body: `{"rows": 42}`})
			warehouse := polScript(steps.FailAfter(steps.ClassRateLimited,
				errors.New("warehouse admission queue is full"), 250*time.Millisecond))
			b := polSetup(t, stepready.DispatchDirect, api, map[string]steps.Handler{"warehouse_load": warehouse})
			id := b.polCreate(t, "retry-after.yaml")
			b.waitTask(t, id, polWait, "complete")

			fetch := b.polStep(t, id, "fetch_report")
			require.Equal(t, 2, fetch.Attempts)
			retries := b.polRetries(t, fetch.ID)
			require.Len(t, retries, 1)
			r := retries[0]
			requested := int64(r.Details["retry_after_ms"].(float64))
			_, sent := api.requests()
			if sent[0] == "1" {
				require.Equal(t, int64(1000), requested)
			} else {
				date, err := http.ParseTime(sent[0])
				require.NoError(t, err)
				// The handler measured the date from its own clock, just before the failure was recorded.
				require.Greater(t, requested, int64(500), "the date's delay, not the 20 ms backoff")
				require.LessOrEqual(t, requested, int64(2000))
				require.False(t, r.Next.Before(date.Add(-time.Millisecond)), "next_attempt_at %s before the date %s", r.Next, date)
				require.Less(t, r.Next.Sub(date), time.Second)
			}
			polRequireExact(t, r, requested, "transient")

			load := b.polStep(t, id, "load_warehouse")
			require.Equal(t, 2, load.Attempts)
			retries = b.polRetries(t, load.ID)
			require.Len(t, retries, 1)
			require.Equal(t, float64(250), retries[0].Details["retry_after_ms"])
			polRequireExact(t, retries[0], 250, steps.ClassRateLimited)
		})
	}
}

// polRequireExact asserts that a retry waited exactly the requested delay: no cap, no jitter.
func polRequireExact(t *testing.T, r polRetry, requestedMS int64, class string) {
	t.Helper()
	require.Equal(t, class, r.Details["class"])
	require.Equal(t, requestedMS, r.DelayMS, "delay_ms is the requested delay")
	require.Equal(t, r.FailedAt.Add(time.Duration(requestedMS)*time.Millisecond), r.Next,
		"next_attempt_at = failure time + exactly %d ms", requestedMS)
	require.NotContains(t, r.Details, "jitter_sample", "no jitter drawn")
	require.NotNil(t, r.Started)
	require.False(t, r.Started.Before(r.Next), "attempt 2 started at %s, before %s", r.Started, r.Next)
	require.Less(t, r.Started.Sub(r.Next), 5*time.Second, "woken by the due timer, not the one-minute poll")
	require.NotContains(t, r.Details, "backoff_delay_ms", "no backoff computed")
}
