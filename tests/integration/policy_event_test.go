package integration

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// record_policy_evaluation appends policy.evaluated for the running attempt only: fenced like every write.
func TestRecordPolicyEvaluationIsFenced(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, step := b.oneStep("")
	attempt := b.run(step, testBase)
	record := func(a int) bool {
		var ok bool
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.record_policy_evaluation($1, $2,
			'{"decision": "retry", "rule_index": 0}', $3)`, step, a, testBase).Scan(&ok))
		return ok
	}
	require.False(t, record(attempt+1), "a stale or future attempt records nothing")
	require.True(t, record(attempt))
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM stepready.step_events
		WHERE step_id = $1 AND event = 'policy.evaluated' AND details ->> 'decision' = 'retry'`, step).Scan(&n))
	require.Equal(t, 1, n)
	b.complete(step, attempt, `{}`, testBase)
	require.False(t, record(attempt), "a finished attempt records nothing")
}
