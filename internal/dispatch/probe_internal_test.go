package dispatch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The re-claims after a move of the wake-up counter: at 25, 75, 175, 375, 775 and 1,575 ms, then every second
// until every transaction running at the move (ids below the xmax read with it) has ended, then one last claim.
// The first version stopped after 1,575 ms whatever was still running: a task whose creating transaction took
// longer to commit (a slow fsync under load) waited for the poll interval (TestSleepEndsWhileEveryWorkerSlotIsBusy
// failed twice at load 40).
func TestProbeReclaimsUntilTheMovingTransactionsEnded(t *testing.T) {
	t.Parallel()
	const interval = 25 * time.Millisecond
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	type tick struct {
		ms    int
		xmin  int64
		claim bool
	}
	cases := []struct {
		name  string
		ticks []tick
	}{
		{"the mover committed at once: the schedule, then the last claim at 2,575 ms", []tick{
			{24, 200, false}, {25, 200, true}, {74, 200, false}, {75, 200, true}, {175, 200, true}, {375, 200, true},
			{775, 200, true}, {1574, 200, false}, {1575, 200, true}, {2574, 200, false}, {2575, 200, true},
			{3575, 200, false}, {60000, 200, false}}},
		{"the mover still running at 2,575 ms: a claim a second until it ended, then one more", []tick{
			{25, 99, true}, {75, 99, true}, {175, 99, true}, {375, 99, true}, {775, 99, true}, {1575, 99, true},
			{2575, 99, true}, {3575, 99, true}, {4574, 150, false}, {4575, 150, true}, {5575, 150, false},
			{9999, 150, false}}},
		{"a transaction running past the poll interval: one last claim, then left to the poll", []tick{
			{25, 99, true}, {75, 99, true}, {175, 99, true}, {375, 99, true}, {775, 99, true}, {1575, 99, true},
			{2575, 99, true}, {3575, 99, true}, {4575, 99, true}, {5575, 99, true}, {6575, 99, false},
			{20000, 99, false}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var s probeState
			require.False(t, s.observe(7, 90, t0.Add(-time.Second), interval), "the first reading is the baseline")
			require.False(t, s.observe(7, 95, t0.Add(-time.Millisecond), interval), "no move")
			require.True(t, s.observe(8, 150, t0, interval), "a move: claim now")
			const giveUp = 5 * time.Second // the poll interval
			for _, k := range tc.ticks {
				require.Equal(t, k.claim, s.recheckDue(at(k.ms), k.xmin, giveUp), "at %d ms, xmin %d", k.ms, k.xmin)
			}
		})
	}
}
