package integration

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// retryEligibleOracle is SPEC §4 read word by word, independently of the SQL: "true when COALESCE(p_attempts,0)
// = 0 (the first attempt is always allowed, whatever the other two say), else COALESCE(p_retryable,true) AND
// p_attempts < COALESCE(p_max_attempts,3)".
func retryEligibleOracle(attempts, maxAttempts *int32, retryable *bool) bool {
	if attempts == nil || *attempts == 0 {
		return true
	}
	canRetry := retryable == nil || *retryable
	limit := int32(3)
	if maxAttempts != nil {
		limit = *maxAttempts
	}
	return canRetry && *attempts < limit
}

func TestRetryEligibleTruthTable(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	attemptsValues := []*int32{ptr[int32](0), ptr[int32](1), ptr[int32](2), ptr[int32](3), nil}
	maxValues := []*int32{ptr[int32](0), ptr[int32](1), ptr[int32](3), nil}
	retryableValues := []*bool{ptr(true), ptr(false), nil}

	// The oracle itself is checked against a count made by hand: 24 combinations with attempts 0 or NULL, plus
	// attempts 1 and 2 below max_attempts 3 or NULL (default 3) with retryable true or NULL: 2 × 2 × 2 = 8.
	combinations, eligible := 0, 0
	for _, a := range attemptsValues {
		for _, m := range maxValues {
			for _, r := range retryableValues {
				combinations++
				if retryEligibleOracle(a, m, r) {
					eligible++
				}
			}
		}
	}
	require.Equal(t, 60, combinations)
	require.Equal(t, 32, eligible)

	for _, a := range attemptsValues {
		for _, m := range maxValues {
			for _, r := range retryableValues {
				want := retryEligibleOracle(a, m, r)
				name := fmt.Sprintf("attempts=%s/max_attempts=%s/retryable=%s", str(a), str(m), str(r))
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					var got *bool
					require.NoError(t, b.db.Pool.QueryRow(t.Context(),
						`SELECT stepready.retry_eligible($1::int, $2::int, $3::bool)`, a, m, r).Scan(&got))
					require.NotNil(t, got, "retry_eligible returned NULL")
					require.Equal(t, want, *got)
				})
			}
		}
	}
}

func TestRetryEligibleNamedCases(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	tests := []struct {
		name        string
		attempts    int32
		maxAttempts int32
		retryable   bool
		want        bool
	}{
		{"max_attempts 0 allows the first attempt", 0, 0, true, true},
		{"max_attempts 0 allows nothing after the first attempt", 1, 0, true, false},
		{"max_attempts 1 allows nothing after the first attempt", 1, 1, true, false},
		{"max_attempts counts the first attempt", 2, 3, true, true},
		{"max_attempts reached", 3, 3, true, false},
		{"retryable false allows the first attempt", 0, 3, false, true},
		{"retryable false allows nothing after the first attempt", 1, 3, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got bool
			require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT stepready.retry_eligible($1, $2, $3)`,
				tt.attempts, tt.maxAttempts, tt.retryable).Scan(&got))
			require.Equal(t, tt.want, got)
		})
	}
}

func TestRetryFunctionsAreImmutable(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	tests := []struct{ signature, result string }{
		{"stepready.retry_eligible(int, int, bool)", "boolean"},
		{"stepready.backoff_delay_ms(text, int, bigint, float8, bigint)", "bigint"},
	}
	for _, tt := range tests {
		t.Run(tt.signature, func(t *testing.T) {
			t.Parallel()
			var volatility, result string
			require.NoError(t, b.db.Pool.QueryRow(t.Context(),
				`SELECT provolatile::text, prorettype::regtype::text FROM pg_catalog.pg_proc
				  WHERE oid = $1::text::regprocedure`, tt.signature).Scan(&volatility, &result))
			require.Equal(t, "i", volatility, "IMMUTABLE")
			require.Equal(t, tt.result, result)
		})
	}
}

const (
	thirtyDaysMs = int64(30 * 24 * time.Hour / time.Millisecond) // 2592000000: the clamp of an uncapped delay
	maxInt32     = int32(math.MaxInt32)
	maxInt64     = int64(math.MaxInt64)
)

func TestBackoffDelayMs(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	require.Equal(t, int64(2592000000), thirtyDaysMs)

	type args struct {
		backoff    string
		attempt    *int32
		base       int64
		multiplier float64
		maxDelay   *int64
	}
	noCap := (*int64)(nil)
	a := func(n int32) *int32 { return &n }
	c := func(n int64) *int64 { return &n }

	tests := []struct {
		name string
		args args
		want int64
	}{
		// Strategies.
		{"none is the base", args{"none", a(1), 1000, 2, c(30000)}, 1000},
		{"none ignores the attempt", args{"none", a(7), 1000, 2, noCap}, 1000},
		{"fixed is the base", args{"fixed", a(1), 1500, 3, noCap}, 1500},
		{"fixed ignores the attempt", args{"fixed", a(9), 1500, 3, noCap}, 1500},
		{"linear attempt 1", args{"linear", a(1), 1000, 2, noCap}, 1000},
		{"linear attempt 3", args{"linear", a(3), 1000, 2, noCap}, 3000},
		{"exponential attempt 1", args{"exponential", a(1), 1000, 2, noCap}, 1000},
		{"exponential attempt 2", args{"exponential", a(2), 1000, 2, noCap}, 2000},
		{"exponential attempt 3", args{"exponential", a(3), 1000, 2, noCap}, 4000},
		{"exponential attempt 4", args{"exponential", a(4), 1000, 2, noCap}, 8000},
		{"standard preset attempt 5", args{"exponential", a(5), 1000, 2, c(30000)}, 16000},
		{"standard preset attempt 6 capped", args{"exponential", a(6), 1000, 2, c(30000)}, 30000},
		{"base 0 exponential", args{"exponential", a(5), 0, 2, noCap}, 0},
		{"base 0 linear", args{"linear", a(5), 0, 2, noCap}, 0},

		// Attempts below 1 count as 1.
		{"exponential attempt 0 counts as 1", args{"exponential", a(0), 1000, 2, noCap}, 1000},
		{"exponential attempt -1 counts as 1", args{"exponential", a(-1), 1000, 2, noCap}, 1000},
		{"linear attempt 0 counts as 1", args{"linear", a(0), 1000, 2, noCap}, 1000},
		{"linear attempt minint counts as 1", args{"linear", a(math.MinInt32), 1000, 2, noCap}, 1000},
		{"exponential NULL attempt counts as 1", args{"exponential", nil, 1000, 2, noCap}, 1000},
		{"linear NULL attempt counts as 1", args{"linear", nil, 1000, 2, noCap}, 1000},

		// The cap.
		{"cap exactly at the value", args{"exponential", a(3), 1000, 2, c(4000)}, 4000},
		{"cap 1 ms below the value", args{"exponential", a(3), 1000, 2, c(3999)}, 3999},
		{"cap 1 ms above the value", args{"exponential", a(3), 1000, 2, c(4001)}, 4000},
		{"cap 0", args{"exponential", a(3), 1000, 2, c(0)}, 0},
		{"fixed capped below the base", args{"fixed", a(1), 1500, 1, c(1000)}, 1000},
		{"linear capped", args{"linear", a(3), 1000, 1, c(2500)}, 2500},
		// 1 × 1.9 = 1.9: truncated to 1 first, so a cap of 2 does not apply (rounding would give 2).
		{"truncation before the cap (1.9 ms, cap 2)", args{"exponential", a(2), 1, 1.9, c(2)}, 1},
		{"truncation before the cap (1464.1 ms, cap 1465)", args{"exponential", a(5), 1000, 1.1, c(1465)}, 1464},
		{"truncated value equal to the cap", args{"exponential", a(5), 1000, 1.1, c(1464)}, 1464},
		{"cap below the truncated value", args{"exponential", a(5), 1000, 1.1, c(1463)}, 1463},

		// NULL cap: uncapped, clamped to 30 days.
		{"uncapped exponential below 30 days", args{"exponential", a(22), 1000, 2, noCap}, 2097152000},
		{"uncapped exponential above 30 days is clamped", args{"exponential", a(23), 1000, 2, noCap}, thirtyDaysMs},
		{"uncapped linear exactly 30 days", args{"linear", a(2592000), 1000, 1, noCap}, thirtyDaysMs},
		{"uncapped linear 1 s over 30 days is clamped", args{"linear", a(2592001), 1000, 1, noCap}, thirtyDaysMs},
		{"uncapped fixed 1 ms over 30 days is clamped", args{"fixed", a(1), thirtyDaysMs + 1, 1, noCap}, thirtyDaysMs},
		{"uncapped fixed 1 ms under 30 days", args{"fixed", a(1), thirtyDaysMs - 1, 1, noCap}, thirtyDaysMs - 1},

		// Huge attempt numbers never overflow.
		{"huge attempt none uncapped", args{"none", a(maxInt32), 1000, 2, noCap}, 1000},
		{"huge attempt fixed uncapped", args{"fixed", a(maxInt32), 1000, 2, noCap}, 1000},
		{"huge attempt linear uncapped", args{"linear", a(maxInt32), 1000, 2, noCap}, thirtyDaysMs},
		{"huge attempt exponential uncapped", args{"exponential", a(maxInt32), 1000, 2, noCap}, thirtyDaysMs},
		{"huge attempt none capped", args{"none", a(maxInt32), 1000, 2, c(30000)}, 1000},
		{"huge attempt fixed capped", args{"fixed", a(maxInt32), 1000, 2, c(30000)}, 1000},
		{"huge attempt linear capped", args{"linear", a(maxInt32), 1000, 2, c(30000)}, 30000},
		{"huge attempt exponential capped", args{"exponential", a(maxInt32), 1000, 2, c(30000)}, 30000},
		{"huge attempt exponential capped at max bigint", args{"exponential", a(maxInt32), 1000, 2, c(maxInt64)}, maxInt64},

		// Huge bases and multipliers never overflow.
		{"huge base fixed uncapped", args{"fixed", a(1), maxInt64, 2, noCap}, thirtyDaysMs},
		{"huge base fixed capped", args{"fixed", a(1), maxInt64, 2, c(5000)}, 5000},
		{"huge base fixed capped at max bigint", args{"fixed", a(1), maxInt64, 2, c(maxInt64)}, maxInt64},
		{"huge base linear uncapped", args{"linear", a(maxInt32), maxInt64, 2, noCap}, thirtyDaysMs},
		{"huge base linear capped at max bigint", args{"linear", a(2), maxInt64, 2, c(maxInt64)}, maxInt64},
		{"huge base exponential uncapped", args{"exponential", a(maxInt32), maxInt64, 2, noCap}, thirtyDaysMs},
		{"huge base exponential capped", args{"exponential", a(maxInt32), maxInt64, 2, c(30000)}, 30000},
		{"huge multiplier uncapped", args{"exponential", a(2), 1000, 1e300, noCap}, thirtyDaysMs},
		{"largest multiplier huge attempt", args{"exponential", a(maxInt32), 1000, math.MaxFloat64, noCap}, thirtyDaysMs},

		// Multiplier 1 and fractional multipliers (truncated to whole ms).
		{"multiplier 1 huge attempt", args{"exponential", a(maxInt32), 1000, 1, noCap}, 1000},
		{"multiplier 1.1 attempt 2", args{"exponential", a(2), 1000, 1.1, noCap}, 1100},
		{"multiplier 1.1 attempt 5 (1464.1)", args{"exponential", a(5), 1000, 1.1, noCap}, 1464},
		{"multiplier 1.5 attempt 3", args{"exponential", a(3), 1000, 1.5, noCap}, 2250},
		{"multiplier 1.5 attempt 4 (337.5)", args{"exponential", a(4), 100, 1.5, noCap}, 337},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got *int64
			require.NoError(t, b.db.Pool.QueryRow(t.Context(),
				`SELECT stepready.backoff_delay_ms($1::text, $2::int, $3::bigint, $4::float8, $5::bigint)`,
				tt.args.backoff, tt.args.attempt, tt.args.base, tt.args.multiplier, tt.args.maxDelay).Scan(&got))
			require.NotNil(t, got, "backoff_delay_ms returned NULL")
			require.Equal(t, tt.want, *got)
		})
	}
}

func TestBackoffDelayMsUnknownStrategy(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	for _, strategy := range []string{"quadratic", ""} {
		t.Run(fmt.Sprintf("%q", strategy), func(t *testing.T) {
			t.Parallel()
			err := b.execErr(`SELECT stepready.backoff_delay_ms($1::text, 1, 1000, 2, NULL)`, strategy)
			requirePgError(t, err, "22023", fmt.Sprintf("'%s'", strategy))
		})
	}
}

// jitterStep creates a one-step task with the given step retry object and puts the step in_progress with
// attempts already charged, as if attempt number `attempts` were running.
func (b *schemaBundle) jitterStep(retry string, attempts int32) int64 {
	b.t.Helper()
	taskID := b.createTask(`{"name": "jitter", "steps": [{"name": "s", "handler": "noop", "retry": ` + retry + `}]}`)
	stepID := b.stepIDs(taskID)["s"]
	b.setStep(stepID, `state = 'in_progress', attempts = $2, lease_owner = 'w',
	                   lease_expires_at = $3`, attempts, testBase.Add(time.Hour))
	return stepID
}

// failDecision is the row fail_step returns.
type failDecision struct {
	State         string     `db:"state"`
	NextAttemptAt *time.Time `db:"next_attempt_at"`
	Reason        *string    `db:"reason"`
}

func (b *schemaBundle) failStep(stepID int64, attempt int32, errJSON string, asOf time.Time, sample float64) (failDecision, error) {
	b.t.Helper()
	var r failDecision
	err := b.db.Pool.QueryRow(b.t.Context(),
		`SELECT state, next_attempt_at, reason FROM stepready.fail_step($1, $2, $3::jsonb, $4, $5)`,
		stepID, attempt, errJSON, asOf, sample).Scan(&r.State, &r.NextAttemptAt, &r.Reason)
	return r, err
}

func TestJitterReplayThroughFailStep(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	tests := []struct {
		name      string
		retry     string
		attempts  int32
		sample    float64
		wantDelay int64
	}{
		// 1001 × (1 − 0.2 × 0.5) = 900.9 → 900.
		{"jitter 0.2 sample 0.5 shortens and truncates", `{"backoff": "fixed", "base_delay_ms": 1001, "jitter": 0.2}`, 1, 0.5, 900},
		{"sample 0 does not shorten", `{"backoff": "fixed", "base_delay_ms": 1001, "jitter": 0.2}`, 1, 0, 1001},
		{"jitter 0 does not shorten", `{"backoff": "fixed", "base_delay_ms": 1001, "jitter": 0}`, 1, 0.5, 1001},
		// 1001 × (1 − 1 × 0.75) = 250.25 → 250.
		{"jitter 1 sample 0.75", `{"backoff": "fixed", "base_delay_ms": 1001, "jitter": 1}`, 1, 0.75, 250},
		// The backoff of the attempt that just failed (3): 1000 × 2² = 4000, × (1 − 0.1 × 0.5) = 3800.
		{"jitter applies to the backoff of this attempt", `{"backoff": "exponential", "base_delay_ms": 1000, "multiplier": 2, "max_attempts": 5, "jitter": 0.1}`, 3, 0.5, 3800},
		// Jitter applies after the cap: min(4000, 3000) × 0.9 = 2700.
		{"jitter applies to the capped delay", `{"backoff": "exponential", "base_delay_ms": 1000, "multiplier": 2, "max_attempts": 5, "max_delay_ms": 3000, "jitter": 0.2}`, 3, 0.5, 2700},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			stepID := b.jitterStep(tt.retry, tt.attempts)
			asOf := testBase.Add(time.Minute)

			res, err := b.failStep(stepID, tt.attempts, `{"class": "transient", "message": "boom"}`, asOf, tt.sample)
			require.NoError(t, err)
			require.Equal(t, "waiting_for_retry", res.State)
			require.Nil(t, res.Reason)
			want := asOf.Add(time.Duration(tt.wantDelay) * time.Millisecond)
			requireTimeIs(t, want, res.NextAttemptAt, "returned next_attempt_at")

			var stored *time.Time
			require.NoError(t, b.db.Pool.QueryRow(t.Context(),
				`SELECT next_attempt_at FROM stepready.steps WHERE id = $1`, stepID).Scan(&stored))
			requireTimeIs(t, want, stored, "stored next_attempt_at")

			// The sample is recorded in the retry.scheduled event, so the schedule can be replayed.
			var details []byte
			require.NoError(t, b.db.Pool.QueryRow(t.Context(),
				`SELECT details FROM stepready.step_events WHERE step_id = $1 AND event = 'retry.scheduled'`,
				stepID).Scan(&details))
			var recorded map[string]any
			require.NoError(t, json.Unmarshal(details, &recorded))
			require.Contains(t, recorded, "jitter_sample")
			require.InDelta(t, tt.sample, recorded["jitter_sample"], 0)
		})
	}
}

func TestJitterReplayIsDeterministic(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	retry := `{"backoff": "exponential", "base_delay_ms": 1000, "multiplier": 3, "max_attempts": 5,
	           "max_delay_ms": 600000, "jitter": 0.5}`
	asOf := testBase.Add(time.Hour)
	const sample = 0.37

	first := b.jitterStep(retry, 2)
	second := b.jitterStep(retry, 2)
	other := b.jitterStep(retry, 2)

	r1, err := b.failStep(first, 2, `{"message": "boom"}`, asOf, sample)
	require.NoError(t, err)
	r2, err := b.failStep(second, 2, `{"message": "boom"}`, asOf, sample)
	require.NoError(t, err)
	r3, err := b.failStep(other, 2, `{"message": "boom"}`, asOf, 0.9)
	require.NoError(t, err)

	// 1000 × 3 = 3000, × (1 − 0.5 × 0.37) = 2445.
	want := asOf.Add(2445 * time.Millisecond)
	requireTimeIs(t, want, r1.NextAttemptAt)
	requireTimeIs(t, want, r2.NextAttemptAt, "the same sample gives the same schedule")
	// 3000 × (1 − 0.5 × 0.9) = 1650: another sample, another (shorter) schedule.
	requireTimeIs(t, asOf.Add(1650*time.Millisecond), r3.NextAttemptAt)

	// Replay from the record alone: the recorded sample and the step's policy give the stored schedule.
	var (
		recordedSample float64
		jitter         float64
		delay          int64
		at             time.Time
		next           time.Time
	)
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `
		SELECT (e.details ->> 'jitter_sample')::float8, s.jitter,
		       stepready.backoff_delay_ms(s.backoff, e.attempt, s.base_delay_ms, s.multiplier, s.max_delay_ms),
		       e.at, s.next_attempt_at
		  FROM stepready.step_events e JOIN stepready.steps s ON s.id = e.step_id
		 WHERE e.step_id = $1 AND e.event = 'retry.scheduled'`, first).
		Scan(&recordedSample, &jitter, &delay, &at, &next))
	require.InDelta(t, sample, recordedSample, 0)
	replayed := int64(math.Trunc(float64(delay) * (1 - jitter*recordedSample)))
	require.Equal(t, int64(2445), replayed)
	require.True(t, at.Add(time.Duration(replayed)*time.Millisecond).Equal(next))
}

func TestJitterSampleOutsideRangeIsRejected(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	for _, sample := range []float64{1, 1.5, -0.1, -1e-9, math.NaN()} {
		t.Run(fmt.Sprint(sample), func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			stepID := b.jitterStep(`{"jitter": 0.5}`, 1)
			_, err := b.failStep(stepID, 1, `{"class": "transient"}`, testBase, sample)
			requirePgError(t, err, "22023", "p_jitter_sample")

			var state string
			require.NoError(t, b.db.Pool.QueryRow(t.Context(),
				`SELECT state FROM stepready.steps WHERE id = $1`, stepID).Scan(&state))
			require.Equal(t, "in_progress", state, "a rejected call changes nothing")
		})
	}
}
