package maintenance_test

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/maintenance"
)

// While one instance holds the reaper's round, every other instance's round is a no-op; concurrent rounds reap
// each expired lease exactly once.
func TestLeaseReaperElectsOneInstancePerRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.task(2, "default")
	// Two enqueued leases that expired an hour ago.
	b.exec(`SELECT count(*) FROM stepready.claim_ready_steps(10, 'dead', 1, now() - interval '1 hour')`)
	r, err := maintenance.NewLeaseReaper(b.env, maintenance.LeaseReaperConfig{})
	require.NoError(t, err)

	release := b.holdLock(maintenance.LockLeaseReaper)
	n, err := r.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "another instance holds the round: this one does not reap")
	release()

	var wg sync.WaitGroup
	counts := make([]int, 4)
	for i := range counts {
		wg.Go(func() {
			var err error
			counts[i], err = r.RunOnce(b.ctx)
			require.NoError(t, err)
		})
	}
	wg.Wait()
	require.Equal(t, 2, counts[0]+counts[1]+counts[2]+counts[3])
	require.Equal(t, 2, b.count(`SELECT count(*) FROM stepready.step_events WHERE event = 'lease.expired'`))
	require.Equal(t, 2.0, testutil.ToFloat64(mustCounter(t, b, "stepready_lease_reaps_total")))
}

// A backlog larger than a batch is reaped in one round: 3,000 attempts whose worker died are all failed as
// stalled by the first round after their lease ended.
func TestLeaseReaperDrainsABacklogInOneRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.task(3000, "default")
	require.Equal(t, 3000, b.count(`SELECT count(*) FROM stepready.claim_and_start_steps(3000, 'dead', 1000,
		now() - interval '1 minute')`))
	r, err := maintenance.NewLeaseReaper(b.env, maintenance.LeaseReaperConfig{Batch: 1000})
	require.NoError(t, err)

	begin := time.Now()
	n, err := r.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 3000, n)
	require.Zero(t, b.count(`SELECT count(*) FROM stepready.steps WHERE state = 'in_progress'`))
	require.Equal(t, 3000, b.count(`SELECT count(*) FROM stepready.steps
		WHERE state = 'waiting_for_retry' AND last_error->>'class' = 'stalled'`))
	t.Logf("3,000 expired leases reaped in one round in %s", time.Since(begin))
}
