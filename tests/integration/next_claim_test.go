package integration

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// next_claim_at is the daemon's wake-up timer: the earliest next_attempt_at after as_of among steps that are
// claimable except for their backoff. Steps behind an unfinished parent, of a paused task, in flight or
// already due do not count.
func TestNextClaimAt(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	nextAt := func(asOf time.Time) *time.Time {
		var next *time.Time
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.next_claim_at($1)`, asOf).Scan(&next))
		return next
	}
	require.Nil(t, nextAt(testBase), "no steps at all")

	_, ids := b.task(`{"name": "t", "steps": [{"name": "due", "handler": "h"},
		{"name": "later", "handler": "h"}, {"name": "child", "handler": "h", "depends_on": ["due"]}]}`)
	require.Nil(t, nextAt(testBase), "steps due now are not a future wake-up")

	in5 := testBase.Add(5 * time.Second)
	b.exec(`UPDATE stepready.steps SET next_attempt_at = $2 WHERE id = $1`, ids["later"], in5)
	b.exec(`UPDATE stepready.steps SET next_attempt_at = $2 WHERE id = $1`, ids["child"], testBase.Add(time.Second))
	require.Equal(t, in5.UTC(), nextAt(testBase).UTC(), "a child behind its parent does not count")
	require.Equal(t, in5.UTC(), nextAt(in5.Add(-tick)).UTC(), "1 µs before")
	require.Nil(t, nextAt(in5), "at the time itself it is due, not future")

	_, other := b.task(`{"name": "u", "steps": [{"name": "x", "handler": "h"}]}`)
	b.exec(`UPDATE stepready.steps SET next_attempt_at = $2 WHERE id = $1`, other["x"], testBase.Add(2*time.Second))
	require.Equal(t, testBase.Add(2*time.Second).UTC(), nextAt(testBase).UTC(), "earliest across tasks")
	b.exec(`SELECT stepready.pause_task((SELECT task_id FROM stepready.steps WHERE id = $1))`, other["x"])
	require.Equal(t, in5.UTC(), nextAt(testBase).UTC(), "a paused task's steps do not count")
}
