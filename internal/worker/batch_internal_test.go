package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// TestBatcherCoalescesWhatArrivesDuringAFlush: a request arriving alone is flushed alone at once; requests that
// arrive while a flush runs all go in the next flush, up to max; every caller gets its own result.
func TestBatcherCoalescesWhatArrivesDuringAFlush(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	b := newBatcher(5, func(_ context.Context, reqs []int) []batchResult[int] {
		mu.Lock()
		sizes = append(sizes, len(reqs))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			<-release // hold the first flush while the others queue up
		}
		out := make([]batchResult[int], len(reqs))
		for i, r := range reqs {
			out[i].res = r * 10
			if r == 7 {
				out[i].err = errors.New("seven")
			}
		}
		return out
	})

	ctx := context.Background()
	firstDone := make(chan batchResult[int], 1)
	go func() {
		v, err, _ := b.do(ctx, 1)
		firstDone <- batchResult[int]{res: v, err: err}
	}()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) == 1 }, 5*time.Second,
		time.Millisecond, "the first request is flushed at once, alone")

	var wg sync.WaitGroup
	results := make([]int, 12)
	errs := make([]error, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i], _ = b.do(ctx, i+2)
		}()
	}
	// All twelve are queued (the channel holds max = 5; the others wait to send) before the first flush ends.
	require.Eventually(t, func() bool { return len(b.in) == 5 }, 5*time.Second, time.Millisecond)
	close(release)
	first := <-firstDone
	require.NoError(t, first.err)
	require.Equal(t, 10, first.res)
	wg.Wait()
	for i := range 12 {
		require.Equal(t, (i+2)*10, results[i], "request %d", i+2)
		if i+2 == 7 {
			require.EqualError(t, errs[i], "seven", "each caller gets its own error")
		} else {
			require.NoError(t, errs[i])
		}
	}
	mu.Lock()
	require.Equal(t, 1, sizes[0])
	require.Equal(t, 5, sizes[1], "the requests queued during the first flush go together, up to max")
	total := 0
	for _, n := range sizes {
		require.LessOrEqual(t, n, 5)
		total += n
	}
	mu.Unlock()
	require.Equal(t, 13, total)

	b.stop()
	_, _, ok := b.do(ctx, 99)
	require.False(t, ok, "a stopped batcher refuses: the caller does the work itself")
}

// batchDB is a database with n one-step tasks whose steps are claimed and started (attempt 1), plus a step
// with collect = merge, also started.
func batchDB(t *testing.T, n int) (*pgtest.DB, []int64, int64) {
	t.Helper()
	ctx := context.Background()
	db := pgtest.New(t)
	for i := range n {
		_, err := db.Pool.Exec(ctx, `SELECT stepready.create_task($1::jsonb)`,
			fmt.Sprintf(`{"name": "t%d", "steps": [{"name": "s", "handler": "h"}]}`, i))
		require.NoError(t, err)
	}
	_, err := db.Pool.Exec(ctx, `SELECT stepready.create_task('{"name": "m", "priority": -1,
		"steps": [{"name": "s", "handler": "h", "collect": "merge"}]}')`)
	require.NoError(t, err)
	started, err := store.ClaimAndStartSteps(ctx, db.Pool, n+1, "w", time.Minute)
	require.NoError(t, err)
	require.Len(t, started, n+1)
	ids := make([]int64, n)
	for i := range n {
		ids[i] = started[i].StepID
		require.Equal(t, 1, started[i].Started.Attempt)
	}
	return db, ids, started[n].StepID
}

func countWhere(t *testing.T, db *pgtest.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func TestBatchRecorderConcurrentOutcomes(t *testing.T) {
	t.Parallel()
	db, ids, _ := batchDB(t, 40)
	c := NewBatchRecorder(db.Pool, 16, nil)
	ctx := context.Background()

	// Even steps succeed, odd steps fail (a retry is scheduled); every step also gets a late outcome of an
	// attempt that is not the running one.
	var wg sync.WaitGroup
	got := make([]bool, len(ids))
	failed := make([]store.FailResult, len(ids))
	stale := make([]store.FailResult, len(ids))
	errs := make([]error, 2*len(ids))
	for i, id := range ids {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				got[i], errs[2*i] = c.Complete(ctx, id, 1, json.RawMessage(fmt.Sprintf(`{"i": %d}`, i)))
			} else {
				failed[i], errs[2*i] = c.Fail(ctx, id, 1, json.RawMessage(`{"class": "transient", "message": "m"}`))
			}
		}()
		go func() {
			defer wg.Done()
			stale[i], errs[2*i+1] = c.Fail(ctx, id, 2, json.RawMessage(`{"class": "transient"}`))
		}()
	}
	wg.Wait()
	c.Stop()
	for i := range ids {
		require.NoError(t, errs[2*i])
		require.NoError(t, errs[2*i+1])
		if i%2 == 0 {
			require.True(t, got[i], "step %d", ids[i])
		} else {
			require.Equal(t, "waiting_for_retry", failed[i].State, "step %d", ids[i])
			require.NotNil(t, failed[i].NextAttemptAt)
		}
		require.True(t, stale[i].Stale(), "the late attempt of step %d is fenced out", ids[i])
	}
	half := len(ids) / 2
	require.Equal(t, half, countWhere(t, db, `SELECT count(*) FROM stepready.steps
		WHERE id = ANY ($1) AND state = 'complete' AND output = jsonb_build_object('i', array_position($1, id) - 1)`, ids))
	require.Equal(t, half, countWhere(t, db, `SELECT count(*) FROM stepready.steps
		WHERE id = ANY ($1) AND state = 'waiting_for_retry' AND attempts = 1`, ids))
	require.Equal(t, half, countWhere(t, db, `SELECT count(*) FROM stepready.tasks WHERE status = 'complete'`))
	require.Equal(t, 2*half, countWhere(t, db, `SELECT count(*) FROM stepready.step_events
		WHERE event IN ('attempt.succeeded', 'step.completed')`))
	require.Equal(t, 2*half, countWhere(t, db, `SELECT count(*) FROM stepready.step_events
		WHERE event IN ('attempt.failed', 'retry.scheduled')`))

	// Stopped: an outcome is still recorded, on its own.
	_, err := db.Pool.Exec(ctx, `SELECT stepready.create_task('{"name": "late", "steps": [{"name": "s", "handler": "h"}]}')`)
	require.NoError(t, err)
	late, err := store.ClaimAndStartSteps(ctx, db.Pool, 1, "w", time.Minute)
	require.NoError(t, err)
	require.Len(t, late, 1)
	ok, err := c.Complete(ctx, late[0].StepID, 1, json.RawMessage(`{}`))
	require.NoError(t, err)
	require.True(t, ok)
}

// TestBatchRecorderIsolatesARefusedEntry: an entry the database refuses (collect = merge with a non-object
// output) fails only itself; the rest of its batch, successes and failures, is recorded.
func TestBatchRecorderIsolatesARefusedEntry(t *testing.T) {
	t.Parallel()
	db, ids, merge := batchDB(t, 4)
	c := NewBatchRecorder(db.Pool, 0, nil)
	defer c.Stop()
	res := c.flush(context.Background(), []outcomeReq{
		{stepID: ids[0], token: 1, output: json.RawMessage(`1`)},
		{stepID: merge, token: 1, output: json.RawMessage(`[1]`)},
		{stepID: ids[1], token: 1, output: json.RawMessage(`2`)},
		{stepID: ids[2], token: 9, output: json.RawMessage(`3`)},
		{stepID: ids[3], token: 1, fail: json.RawMessage(`{"class": "transient", "message": "x"}`)},
	})
	require.Len(t, res, 5)
	require.NoError(t, res[0].err)
	require.True(t, res[0].res.completed)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, res[1].err, &pgErr)
	require.Equal(t, "22023", pgErr.Code)
	require.NoError(t, res[2].err)
	require.True(t, res[2].res.completed)
	require.NoError(t, res[3].err)
	require.False(t, res[3].res.completed, "fenced")
	require.NoError(t, res[4].err)
	require.Equal(t, "waiting_for_retry", res[4].res.failed.State, "a failure of the same batch is recorded too")
	require.Equal(t, 2, countWhere(t, db, `SELECT count(*) FROM stepready.steps WHERE state = 'complete'`))
	require.Equal(t, 1, countWhere(t, db, `SELECT count(*) FROM stepready.steps WHERE state = 'waiting_for_retry'`))
	require.Equal(t, "in_progress", func() string {
		var s string
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT state FROM stepready.steps WHERE id = $1`,
			merge).Scan(&s))
		return s
	}())
}

func TestBatchStarter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for i := range 3 {
		_, err := db.Pool.Exec(ctx, `SELECT stepready.create_task($1::jsonb)`,
			fmt.Sprintf(`{"name": "t%d", "context": {"n": %d}, "steps": [{"name": "s", "handler": "h", "input": {"i": %d}}]}`, i, i, i))
		require.NoError(t, err)
	}
	claimed, err := store.ClaimReadySteps(ctx, db.Pool, 10, "w", time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 3)
	s := NewBatchStarter(db.Pool, "w", time.Minute, 0, nil)
	defer s.Stop()

	// A repeated step in one batch (two River jobs of one step): the batch is refused as a whole, then each entry
	// runs on its own, and the step starts once.
	res := s.flush(ctx, []int64{claimed[0].StepID, claimed[1].StepID, claimed[0].StepID, 1 << 40})
	require.Len(t, res, 4)
	for _, r := range res {
		require.NoError(t, r.err)
	}
	require.True(t, res[0].res.ok)
	require.Equal(t, 1, res[0].res.st.Attempt)
	require.JSONEq(t, `{"i": 0}`, string(res[0].res.st.Input))
	require.JSONEq(t, `{"n": 0}`, string(res[0].res.st.Context))
	require.True(t, res[1].res.ok)
	require.False(t, res[2].res.ok, "started once")
	require.False(t, res[3].res.ok, "no such step")

	st, ok, err := s.Start(ctx, claimed[2].StepID)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 1, st.Attempt)
	_, ok, err = s.Start(ctx, claimed[2].StepID)
	require.NoError(t, err)
	require.False(t, ok, "no longer enqueued")
	require.Equal(t, 3, countWhere(t, db, `SELECT count(*) FROM stepready.step_events WHERE event = 'attempt.started'`))
}

// TestBatchRecorderAsync: CompleteAsync and FailAsync return before their batch and report its result through
// done (fenced entries included); Stop records everything queued; after Stop they record on their own.
func TestBatchRecorderAsync(t *testing.T) {
	t.Parallel()
	db, ids, _ := batchDB(t, 5)
	r := NewBatchRecorder(db.Pool, 0, nil)
	ctx := context.Background()

	type outcome struct {
		id        int64
		completed bool
		failed    store.FailResult
		err       error
	}
	results := make(chan outcome, len(ids)+2)
	r.CompleteAsync(ctx, ids[0], 1, json.RawMessage(`{"n": 0}`), func(ok bool, err error) {
		results <- outcome{id: ids[0], completed: ok, err: err}
	})
	r.CompleteAsync(ctx, ids[1], 2, json.RawMessage(`{}`), func(ok bool, err error) { // not the running attempt
		results <- outcome{id: ids[1], completed: ok, err: err}
	})
	r.FailAsync(ctx, ids[2], 1, json.RawMessage(`{"class": "transient"}`), func(f store.FailResult, err error) {
		results <- outcome{id: ids[2], failed: f, err: err}
	})
	r.Stop() // records what is queued: every done has been called when it returns
	require.Len(t, results, 3)

	// Stopped: recorded on their own, done called before returning.
	r.CompleteAsync(ctx, ids[3], 1, json.RawMessage(`{}`), func(ok bool, err error) {
		results <- outcome{id: ids[3], completed: ok, err: err}
	})
	r.FailAsync(ctx, ids[4], 1, json.RawMessage(`{"class": "permanent"}`), func(f store.FailResult, err error) {
		results <- outcome{id: ids[4], failed: f, err: err}
	})
	close(results)
	got := map[int64]outcome{}
	for o := range results {
		require.NoError(t, o.err, "step %d", o.id)
		got[o.id] = o
	}
	require.True(t, got[ids[0]].completed)
	require.False(t, got[ids[1]].completed, "fenced out")
	require.Equal(t, "waiting_for_retry", got[ids[2]].failed.State)
	require.True(t, got[ids[3]].completed)
	require.Equal(t, "error", got[ids[4]].failed.State)
	require.Equal(t, 2, countWhere(t, db, `SELECT count(*) FROM stepready.steps WHERE id = ANY ($1) AND state = 'complete'`, ids))
}
