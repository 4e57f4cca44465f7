package integration

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFailStepDecision walks the decision of SPEC §6 one rule and one boundary per case: the step fails
// len(prior) times with the given errors (each a scheduled retry), then once more with err; the last decision
// is checked. The standard preset applies unless the step says otherwise: 3 attempts, exponential 1000 ms × 2,
// capped at 30 s, no jitter.
func TestFailStepDecision(t *testing.T) {
	t.Parallel()

	type failCase struct {
		name       string
		step       string   // extra JSON fields of the step
		prior      []string // errors of the earlier failures, each must schedule a retry
		err        string
		sample     float64
		wantState  string
		wantReason string        // "" = NULL (a retry)
		wantDelay  time.Duration // next_attempt_at - as_of when retrying
		wantClass  string        // class recorded in the events; "" = the class of err
	}
	transient := `{"class": "transient", "message": "connection reset"}`
	twice := []string{transient, transient}
	cases := []failCase{
		// Retries and their schedule.
		{name: "first failure retries after the base delay", err: transient,
			wantState: "waiting_for_retry", wantDelay: 1000 * time.Millisecond},
		{name: "attempt max_attempts-1 still retries", prior: []string{transient}, err: transient,
			wantState: "waiting_for_retry", wantDelay: 2000 * time.Millisecond},
		{name: "attempt max_attempts: retries_exhausted", prior: twice, err: transient,
			wantState: "error", wantReason: "retries_exhausted"},
		{name: "max_attempts 1", step: `"retry": {"max_attempts": 1}`, err: transient,
			wantState: "error", wantReason: "retries_exhausted"},
		{name: "max_attempts 0: nothing after the first attempt", step: `"retry": {"max_attempts": 0}`, err: transient,
			wantState: "error", wantReason: "retries_exhausted"},
		{name: "exponential backoff of the attempt that failed",
			step:  `"retry": {"max_attempts": 9, "backoff": "exponential", "base_delay_ms": 100, "multiplier": 3}`,
			prior: twice, err: transient, wantState: "waiting_for_retry", wantDelay: 900 * time.Millisecond},
		{name: "linear backoff", step: `"retry": {"max_attempts": 9, "backoff": "linear", "base_delay_ms": 250}`,
			prior: []string{transient, transient, transient}, err: transient,
			wantState: "waiting_for_retry", wantDelay: 1000 * time.Millisecond},
		{name: "fixed backoff", step: `"retry": {"max_attempts": 9, "backoff": "fixed", "base_delay_ms": 300}`,
			prior: twice, err: transient, wantState: "waiting_for_retry", wantDelay: 300 * time.Millisecond},
		{name: "backoff capped at max_delay_ms", step: `"retry": {"max_attempts": 9, "max_delay_ms": 1500}`,
			prior: []string{transient}, err: transient,
			wantState: "waiting_for_retry", wantDelay: 1500 * time.Millisecond},
		{name: "jitter shortens by jitter x sample", step: `"retry": {"jitter": 0.5}`, err: transient,
			sample: 0.5, wantState: "waiting_for_retry", wantDelay: 750 * time.Millisecond},
		{name: "jitter with sample 0 keeps the delay", step: `"retry": {"jitter": 0.5}`, err: transient,
			sample: 0, wantState: "waiting_for_retry", wantDelay: 1000 * time.Millisecond},

		// Classes.
		{name: "permanent class", err: `{"class": "permanent"}`, wantState: "error", wantReason: "not_retryable"},
		{name: "deterministic class", err: `{"class": "deterministic"}`,
			wantState: "error", wantReason: "not_retryable"},
		{name: "budget_exhausted class", err: `{"class": "budget_exhausted"}`,
			wantState: "error", wantReason: "not_retryable"},
		{name: "canceled class", err: `{"class": "canceled"}`, wantState: "error", wantReason: "not_retryable"},
		{name: "a retryable:true error cannot make a permanent class retryable",
			err: `{"class": "permanent", "retryable": true}`, wantState: "error", wantReason: "not_retryable"},
		{name: "error says retryable false", err: `{"class": "transient", "retryable": false}`,
			wantState: "error", wantReason: "not_retryable"},
		{name: "step retryable false", step: `"retry": {"retryable": false, "max_attempts": 5}`, err: transient,
			wantState: "error", wantReason: "not_retryable"},
		{name: "not_retryable before retries_exhausted", step: `"retry": {"max_attempts": 1}`,
			err: `{"class": "permanent"}`, wantState: "error", wantReason: "not_retryable"},
		{name: "not_retryable before the breaker", step: `"breaker_limit": 1`, err: `{"class": "deterministic"}`,
			wantState: "error", wantReason: "not_retryable"},
		{name: "breaker before retries_exhausted", step: `"retry": {"max_attempts": 3}`,
			prior: []string{`{"class": "contract_failure", "message": "bad"}`,
				`{"class": "contract_failure", "message": "bad"}`},
			err: `{"class": "contract_failure", "message": "bad"}`, wantState: "error", wantReason: "circuit_open"},
		{name: "retryable classes retry", err: `{"class": "rate_limited"}`,
			wantState: "waiting_for_retry", wantDelay: time.Second},
		{name: "timeout class retries", err: `{"class": "timeout"}`,
			wantState: "waiting_for_retry", wantDelay: time.Second},
		{name: "unknown class is recorded and treated as transient", err: `{"class": "martian_weather"}`,
			wantState: "waiting_for_retry", wantDelay: time.Second, wantClass: "martian_weather"},
		{name: "unknown class on the last attempt is exhausted, not retried", prior: twice,
			err: `{"class": "martian_weather"}`, wantState: "error", wantReason: "retries_exhausted",
			wantClass: "martian_weather"},
		{name: "missing class is transient", err: `{"message": "no class"}`,
			wantState: "waiting_for_retry", wantDelay: time.Second, wantClass: "transient"},
		{name: "empty error document is transient", err: `{}`,
			wantState: "waiting_for_retry", wantDelay: time.Second, wantClass: "transient"},

		// Retry-After.
		{name: "retry_after_ms is used exactly, above the cap, without jitter",
			step: `"retry": {"jitter": 1, "max_delay_ms": 30000}`,
			err:  `{"class": "rate_limited", "retry_after_ms": 45000}`, sample: 0.9,
			wantState: "waiting_for_retry", wantDelay: 45 * time.Second},
		{name: "retry_after_ms 0 retries at as_of", err: `{"class": "rate_limited", "retry_after_ms": 0}`,
			wantState: "waiting_for_retry", wantDelay: 0},
		{name: "retry_after_ms null falls back to the backoff", err: `{"class": "rate_limited", "retry_after_ms": null}`,
			wantState: "waiting_for_retry", wantDelay: time.Second},
		{name: "retry_after_ms grants no extra attempt", prior: twice,
			err: `{"class": "rate_limited", "retry_after_ms": 10}`, wantState: "error", wantReason: "retries_exhausted"},

		// p_error.retry overrides, for this failure only.
		{name: "override max_attempts lower", err: `{"retry": {"max_attempts": 1}}`,
			wantState: "error", wantReason: "retries_exhausted", wantClass: "transient"},
		{name: "override max_attempts higher", prior: twice, err: `{"retry": {"max_attempts": 5}}`,
			wantState: "waiting_for_retry", wantDelay: 4 * time.Second, wantClass: "transient"},
		{name: "override backoff and base_delay_ms", prior: []string{transient},
			err:       `{"retry": {"backoff": "linear", "base_delay_ms": 700}}`,
			wantState: "waiting_for_retry", wantDelay: 1400 * time.Millisecond, wantClass: "transient"},
		{name: "override base_delay_ms", err: `{"retry": {"base_delay_ms": 50}}`,
			wantState: "waiting_for_retry", wantDelay: 50 * time.Millisecond, wantClass: "transient"},
		{name: "override max_delay_ms lower", prior: []string{transient}, err: `{"retry": {"max_delay_ms": 500}}`,
			wantState: "waiting_for_retry", wantDelay: 500 * time.Millisecond, wantClass: "transient"},
		{name: "override max_delay_ms above the step's cap", step: `"retry": {"max_attempts": 10}`,
			prior: []string{transient, transient, transient, transient, transient},
			err:   `{"retry": {"max_delay_ms": 100000}}`,
			// attempt 6: 1000 × 2^5 = 32000, above the step's 30000 cap but under the override.
			wantState: "waiting_for_retry", wantDelay: 32 * time.Second, wantClass: "transient"},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep(tc.step)
			now := testBase
			for _, prior := range tc.prior {
				now = b.retryOnce(step, prior, now)
			}
			attempt := b.run(step, now)
			require.Equal(t, len(tc.prior)+1, attempt)
			r := b.fail(step, attempt, tc.err, now, tc.sample)
			require.Equal(t, tc.wantState, deref(r.State), "reason %v", deref(r.Reason))
			require.Equal(t, tc.wantReason, deref(r.Reason))

			s := b.step(step)
			require.Equal(t, tc.wantState, s.State)
			require.Equal(t, attempt, s.Attempts, "a failure does not change the attempt count")
			require.Nil(t, s.LeaseOwner)
			var errDoc map[string]any
			require.NoError(t, json.Unmarshal([]byte(tc.err), &errDoc))
			wantClass := tc.wantClass
			if wantClass == "" {
				wantClass, _ = errDoc["class"].(string)
			}

			evs := b.lastEvents(step, 2)
			require.Equal(t, "attempt.failed", evs[0].Event)
			require.Equal(t, attempt, deref(evs[0].Attempt))
			require.Equal(t, "in_progress", deref(evs[0].FromState))
			require.Equal(t, wantClass, evs[0].Details["class"])
			for _, ev := range evs {
				require.True(t, now.Equal(ev.At), "events are stamped with p_as_of")
			}

			if tc.wantState == "waiting_for_retry" {
				due := now.Add(tc.wantDelay)
				requireTime(t, due, r.NextAttemptAt, "returned next_attempt_at")
				requireTime(t, due, s.NextAttemptAt, "stored next_attempt_at")
				b.requireStatus(taskID, "in_progress")
				require.Equal(t, "retry.scheduled", evs[1].Event)
				require.EqualValues(t, tc.wantDelay.Milliseconds(), evs[1].Details["delay_ms"])
				require.Equal(t, wantClass, evs[1].Details["class"])
				if _, retryAfter := errDoc["retry_after_ms"].(float64); !retryAfter {
					require.EqualValues(t, tc.sample, evs[1].Details["jitter_sample"], "the sample is recorded")
				}
				// Ready exactly when due, not an instant before.
				if tc.wantDelay > 0 {
					b.requireNotReady(step, due.Add(-tick), "backoff")
				}
				b.requireReady(step, due)
				return
			}

			require.Nil(t, r.NextAttemptAt)
			require.Nil(t, s.NextAttemptAt)
			b.requireStatus(taskID, "error")
			require.Equal(t, "step.failed", evs[1].Event)
			require.Equal(t, tc.wantReason, evs[1].Details["reason"])
			require.Equal(t, "error", deref(evs[1].ToState))
			var lastError map[string]any
			require.NoError(t, json.Unmarshal([]byte(deref(s.LastError)), &lastError))
			require.Equal(t, wantClass, lastError["class"])
			require.Equal(t, tc.wantReason, lastError["reason"])
			require.EqualValues(t, attempt, lastError["attempt"])
			require.Empty(t, b.claimIDs(now.Add(time.Hour)), "nothing more runs")
		})
	}
}

// TestFailStepCircuitBreaker feeds each case's failures to one step (20 attempts, no backoff) and checks the
// outcome of each: "" = retry scheduled, else the error reason.
func TestFailStepCircuitBreaker(t *testing.T) {
	t.Parallel()

	cf := func(msg string) string { return `{"class": "contract_failure", "message": "` + msg + `"}` }
	type failure struct{ err, want string }
	rep := func(err string, n int, last string) []failure {
		out := make([]failure, n)
		for i := range out {
			out[i] = failure{err, ""}
		}
		out[n-1].want = last
		return out
	}

	cases := []struct {
		name     string
		limit    string // breaker_limit JSON, "" = default (3)
		failures []failure
	}{
		{"same message three times opens the circuit", "", rep(cf("schema mismatch"), 3, "circuit_open")},
		{"two in a row do not", "", rep(cf("schema mismatch"), 2, "")},
		{"messages differing only in numbers and hex ids are the same", "", []failure{
			{cf("request 4f3a9c took 31ms"), ""},
			{cf("request 77b2e1 took 29ms"), ""},
			{cf("request 0a0b0c took 1200ms"), "circuit_open"},
		}},
		{"all-letter hex words of 8+ letters are collapsed", "", []failure{
			{cf("checksum deadbeef mismatch"), ""},
			{cf("checksum cafebabe mismatch"), ""},
			{cf("checksum facefeed mismatch"), "circuit_open"},
		}},
		{"case does not matter", "", []failure{
			{cf("Field Missing"), ""}, {cf("field missing"), ""}, {cf("FIELD MISSING"), "circuit_open"},
		}},
		{"different words are different messages", "", []failure{
			{cf("user alice missing"), ""}, {cf("user bobby missing"), ""}, {cf("user alice missing"), ""},
		}},
		{"a different message in between resets the streak", "", []failure{
			{cf("a broke"), ""}, {cf("a broke"), ""}, {cf("b broke"), ""},
			{cf("a broke"), ""}, {cf("a broke"), ""}, {cf("a broke"), "circuit_open"},
		}},
		{"a non-breaker class in between resets the streak", "", []failure{
			{cf("a broke"), ""}, {cf("a broke"), ""}, {`{"class": "transient", "message": "a broke"}`, ""},
			{cf("a broke"), ""}, {cf("a broke"), ""}, {cf("a broke"), "circuit_open"},
		}},
		{"same message, another breaker class, is another fingerprint", "", []failure{
			{cf("a broke"), ""}, {cf("a broke"), ""},
			{`{"class": "test_failure", "message": "a broke"}`, ""},
		}},
		{"test_failure counts too", "", rep(`{"class": "test_failure", "message": "assert"}`, 3, "circuit_open")},
		{"non-breaker classes never open it", "", rep(`{"class": "timeout", "message": "slow"}`, 8, "")},
		{"breaker_limit 0 disables", "0", rep(cf("schema mismatch"), 8, "")},
		{"breaker_limit 1", "1", rep(cf("schema mismatch"), 1, "circuit_open")},
		{"breaker_limit 2", "2", rep(cf("schema mismatch"), 2, "circuit_open")},
		{"breaker_limit 5", "5", rep(cf("schema mismatch"), 5, "circuit_open")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			extra := `"retry": {"max_attempts": 20, "backoff": "fixed", "base_delay_ms": 0}`
			if tc.limit != "" {
				extra += `, "breaker_limit": ` + tc.limit
			}
			taskID, step := b.oneStep(extra)
			for i, f := range tc.failures {
				attempt := b.run(step, testBase)
				r := b.fail(step, attempt, f.err, testBase, 0)
				if f.want == "" {
					require.Equal(t, "waiting_for_retry", deref(r.State), "failure %d: reason %v", i+1,
						deref(r.Reason))
					continue
				}
				require.Equal(t, "error", deref(r.State), "failure %d", i+1)
				require.Equal(t, f.want, deref(r.Reason), "failure %d", i+1)
				require.Less(t, attempt, 20, "the circuit opens with attempts left")
				b.requireStatus(taskID, "error")
				ev := b.lastEvents(step, 1)[0]
				require.Equal(t, "step.failed", ev.Event)
				require.Equal(t, "circuit_open", ev.Details["reason"])
			}
		})
	}
}

func TestFailStepBreakerStreakResetsOnNewIteration(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, step := b.oneStep(`"retry": {"max_attempts": 20, "backoff": "fixed", "base_delay_ms": 0}`)
	err := `{"class": "contract_failure", "message": "bad page"}`
	b.retryOnce(step, err, testBase)
	b.retryOnce(step, err, testBase)
	require.True(t, b.continueStep(step, b.run(step, testBase), `{}`, nil, 0, testBase))
	b.retryOnce(step, err, testBase)
	b.retryOnce(step, err, testBase)
	r := b.fail(step, b.run(step, testBase), err, testBase, 0)
	require.Equal(t, "circuit_open", deref(r.Reason), "three in a row within the new iteration")
}

// TestFailStepOverrideAppliesToThisFailureOnly: p_error.retry shapes the decision of the failure it comes with;
// the next failure is decided by the step's own policy again.
func TestFailStepOverrideAppliesToThisFailureOnly(t *testing.T) {
	t.Parallel()

	t.Run("backoff", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		_, step := b.oneStep("")
		now := b.retryOnce(step, `{"retry": {"backoff": "fixed", "base_delay_ms": 10}}`, testBase)
		requireTime(t, testBase.Add(10*time.Millisecond), &now, "overridden delay")
		// Attempt 2 fails without an override: the step's exponential 1000 × 2.
		r := b.fail(step, b.run(step, now), `{}`, now, 0)
		requireTime(t, now.Add(2*time.Second), r.NextAttemptAt, "step policy delay")
	})

	t.Run("max_attempts", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		_, step := b.oneStep("")
		now := b.retryOnce(step, `{}`, testBase)
		now = b.retryOnce(step, `{}`, now)
		// Attempt 3 of 3 would be the last; the override lets it retry, and the retry must really run.
		now = b.retryOnce(step, `{"retry": {"max_attempts": 5, "base_delay_ms": 10}}`, now)
		attempt := b.run(step, now)
		require.Equal(t, 4, attempt)
		// Attempt 4 fails without an override: the step's own max_attempts (3) decides: no fifth attempt.
		r := b.fail(step, attempt, `{}`, now, 0)
		require.Equal(t, "retries_exhausted", deref(r.Reason))
	})
}

func TestFailStepRejectsBadInput(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name   string
		err    string
		sample float64
		param  string
	}{
		{"negative retry_after_ms", `{"retry_after_ms": -1}`, 0, "retry_after_ms"},
		{"string retry_after_ms", `{"retry_after_ms": "100"}`, 0, "retry_after_ms"},
		{"boolean retry_after_ms", `{"retry_after_ms": true}`, 0, "retry_after_ms"},
		{"object retry_after_ms", `{"retry_after_ms": {}}`, 0, "retry_after_ms"},
		{"non-object error", `["boom"]`, 0, "p_error"},
		{"empty class", `{"class": ""}`, 0, "class"},
		{"non-boolean retryable", `{"retryable": "no"}`, 0, "retryable"},
		{"unknown retry override", `{"retry": {"tries": 2}}`, 0, "tries"},
		{"bad retry override backoff", `{"retry": {"backoff": "quadratic"}}`, 0, "quadratic"},
		{"jitter sample 1", `{}`, 1, "p_jitter_sample"},
		{"negative jitter sample", `{}`, -0.01, "p_jitter_sample"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep("")
			attempt := b.run(step, testBase)
			before := b.taskSnapshot(taskID)
			_, err := b.failErr(step, attempt, tc.err, testBase, tc.sample)
			requireSQLState(t, err, "22023", tc.param)
			require.Equal(t, before, b.taskSnapshot(taskID), "bad input changes nothing")
		})
	}
}

func TestFailStepFencing(t *testing.T) {
	t.Parallel()
	at := testBase

	cases := []struct {
		name      string
		setup     func(b *lifecycleBundle, step int64) int
		wantState string
	}{
		{"attempt ahead", func(b *lifecycleBundle, step int64) int { return b.run(step, at) + 1 }, "in_progress"},
		{"stale attempt after a retry", func(b *lifecycleBundle, step int64) int {
			b.run(step, b.retryOnce(step, `{}`, at))
			return 1
		}, "in_progress"},
		{"duplicate failure of an attempt already failed", func(b *lifecycleBundle, step int64) int {
			b.retryOnce(step, `{}`, at)
			return 1
		}, "waiting_for_retry"},
		{"enqueued, never started", func(b *lifecycleBundle, step int64) int { b.enqueue(step, at); return 0 }, "enqueued"},
		{"complete", func(b *lifecycleBundle, step int64) int { b.runToComplete(step, `{}`, at); return 1 }, "complete"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep("")
			attempt := tc.setup(b, step)
			s := b.step(step)
			before := b.taskSnapshot(taskID)

			r := b.fail(step, attempt, `{"class": "permanent"}`, at.Add(time.Minute), 0)
			require.Equal(t, tc.wantState, deref(r.State))
			require.Equal(t, "stale_attempt", deref(r.Reason))
			requireSameTime(t, s.NextAttemptAt, r.NextAttemptAt, "next_attempt_at")
			require.Equal(t, before, b.taskSnapshot(taskID), "a fenced fail_step changes nothing")
		})
	}

	t.Run("unknown step", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		r := b.fail(424242, 1, `{}`, at, 0)
		require.Nil(t, r.State)
		require.Equal(t, "stale_attempt", deref(r.Reason))
	})
}

func TestFailStepEventDetails(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, step := b.oneStep(`"retry": {"jitter": 0.2, "max_attempts": 2}`)

	attempt := b.run(step, testBase)
	r := b.fail(step, attempt, `{"class": "timeout", "message": "slow", "code": "E1"}`, testBase, 0.25)
	// 1000 × (1 − 0.2 × 0.25) = 950
	requireTime(t, testBase.Add(950*time.Millisecond), r.NextAttemptAt, "next_attempt_at")
	evs := b.lastEvents(step, 2)
	require.Equal(t, []string{"attempt.failed", "retry.scheduled"}, eventNames(evs))
	d := evs[1].Details
	require.Equal(t, "timeout", d["class"])
	require.EqualValues(t, 950, d["delay_ms"])
	require.EqualValues(t, 0.25, d["jitter_sample"])
	require.Equal(t, "waiting_for_retry", deref(evs[1].ToState))
	errDoc, ok := evs[0].Details["error"].(map[string]any)
	require.True(t, ok, "the error is recorded: %v", evs[0].Details)
	require.Equal(t, "slow", errDoc["message"])
	require.Equal(t, "E1", errDoc["code"])

	now := *r.NextAttemptAt
	attempt = b.run(step, now)
	r = b.fail(step, attempt, `{"class": "timeout", "message": "slow again"}`, now, 0.5)
	require.Equal(t, "retries_exhausted", deref(r.Reason))
	evs = b.lastEvents(step, 2)
	require.Equal(t, []string{"attempt.failed", "step.failed"}, eventNames(evs))
	require.Equal(t, "retries_exhausted", evs[1].Details["reason"])
	require.Equal(t, "timeout", evs[1].Details["class"])
	require.Equal(t, 2, deref(evs[1].Attempt))
}

// TestFailStepWorkedExamples runs the two worked examples of SPEC §4 end to end through claim_ready_steps:
// the first attempt is allowed, there is no second.
func TestFailStepWorkedExamples(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name       string
		step       string
		wantReason string
	}{
		{"max_attempts 0", `"retry": {"max_attempts": 0}`, "retries_exhausted"},
		{"retryable false", `"retry": {"retryable": false, "max_attempts": 3}`, "not_retryable"},
		{"preset none", `"retry": {"policy": "none"}`, "not_retryable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep(tc.step + `, "on_exhausted": "skip"`)
			require.Equal(t, []int64{step}, b.claimIDs(testBase), "the first attempt is allowed")
			require.Equal(t, 1, deref(b.start(step, testBase)))
			r := b.fail(step, 1, `{"class": "transient"}`, testBase, 0)
			require.Equal(t, "skipped", deref(r.State))
			require.Equal(t, tc.wantReason, deref(r.Reason))
			require.Empty(t, b.claimIDs(testBase.Add(24*time.Hour)), "no second attempt")
			b.requireStatus(taskID, "complete")
		})
	}
}

func TestFailStepOnExhaustedFailTask(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	taskID, ids := b.task(`{"name": "t", "steps": [
		{"name": "a", "handler": "h", "priority": 10},
		{"name": "sibling", "handler": "h", "priority": 5},
		{"name": "idle", "handler": "h"},
		{"name": "child", "handler": "h", "depends_on": ["sibling"]}]}`)
	require.Equal(t, []int64{ids["a"], ids["sibling"]}, claimedIDs(b.claim(2, at)))
	attemptA := deref(b.start(ids["a"], at))
	attemptSib := deref(b.start(ids["sibling"], at))

	r := b.fail(ids["a"], attemptA, `{"class": "permanent"}`, at, 0)
	require.Equal(t, "error", deref(r.State))
	b.requireStatus(taskID, "error")
	require.Empty(t, b.claimIDs(at.Add(time.Hour)), "no new step of the task starts")
	b.requireNotReady(ids["idle"], at, "task_not_active")

	// The in-flight sibling may finish; its child still does not start.
	require.True(t, b.complete(ids["sibling"], attemptSib, `{"done": true}`, at))
	b.requireState(ids["sibling"], "complete")
	b.requireStatus(taskID, "error")
	require.Empty(t, b.claimIDs(at.Add(time.Hour)))
	b.requireNotReady(ids["child"], at, "task_not_active")
}

func TestFailStepOnExhaustedSkip(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	taskID, ids := b.task(`{"name": "t", "steps": [
		{"name": "a", "handler": "h", "on_exhausted": "skip", "retry": {"max_attempts": 1}},
		{"name": "dep", "handler": "h", "depends_on": ["a"]}]}`)
	attempt := b.run(ids["a"], at)
	r := b.fail(ids["a"], attempt, `{"class": "transient"}`, at, 0)
	require.Equal(t, "skipped", deref(r.State))
	require.Equal(t, "retries_exhausted", deref(r.Reason))
	require.Nil(t, r.NextAttemptAt)
	b.requireState(ids["a"], "skipped")
	require.Equal(t, []string{"attempt.failed", "step.failed", "step.skipped"},
		eventNames(b.lastEvents(ids["a"], 3)))
	b.requireStatus(taskID, "in_progress")

	// The dependent proceeds and the task completes.
	require.Equal(t, []int64{ids["dep"]}, b.claimIDs(at))
	require.True(t, b.complete(ids["dep"], deref(b.start(ids["dep"], at)), `{}`, at))
	b.requireStatus(taskID, "complete")
}

func TestFailStepOnExhaustedSkipCascade(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	// a -> b -> c, a -> c, plus an unrelated branch x -> y.
	taskID, ids := b.task(`{"name": "t", "steps": [
		{"name": "a", "handler": "h", "on_exhausted": "skip_cascade"},
		{"name": "b", "handler": "h", "depends_on": ["a"]},
		{"name": "c", "handler": "h", "depends_on": ["a", "b"]},
		{"name": "x", "handler": "h"},
		{"name": "y", "handler": "h", "depends_on": ["x"]}]}`)
	attempt := b.run(ids["a"], at)
	r := b.fail(ids["a"], attempt, `{"class": "permanent"}`, at, 0)
	require.Equal(t, "skipped", deref(r.State))
	require.Equal(t, "not_retryable", deref(r.Reason))

	for _, name := range []string{"a", "b", "c"} {
		b.requireState(ids[name], "skipped")
	}
	for _, name := range []string{"b", "c"} {
		ev := b.lastEvents(ids[name], 1)[0]
		require.Equal(t, "step.skipped", ev.Event, name)
		require.Equal(t, "pending", deref(ev.FromState), name)
	}
	b.requireState(ids["x"], "pending")
	b.requireStatus(taskID, "in_progress")

	require.Equal(t, []int64{ids["x"]}, b.claimIDs(at), "the unrelated branch proceeds")
	require.True(t, b.complete(ids["x"], deref(b.start(ids["x"], at)), `{}`, at))
	require.Equal(t, []int64{ids["y"]}, b.claimIDs(at))
	require.True(t, b.complete(ids["y"], deref(b.start(ids["y"], at)), `{}`, at))
	b.requireStatus(taskID, "complete")
}
