package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// runParallel runs fn(i) for i in [0, n) on n goroutines, each holding its own connection of pool, released all
// at once by a barrier after every connection is acquired. It returns the first error any of them reported.
func runParallel(ctx context.Context, pool *pgxpool.Pool, n int, fn func(i int, conn *pgxpool.Conn) error) error {
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		conns[i] = c
	}
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := fn(i, conns[i]); err != nil {
				errs <- fmt.Errorf("goroutine %d: %w", i, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	return <-errs // nil when the channel is empty
}

// TestClaimReadyStepsConcurrentClaimersGetDisjointSets: 8 connections claim 400 ready steps (of 100 new,
// pending tasks) in batches of 7 at once; every step is claimed by exactly one of them, without errors, and
// every (step, attempt) is started exactly once even when every worker tries to start every step. The claim
// race is repeated over several rounds of fresh tasks, because a lock-order problem between claimers shows only
// in some interleavings.
func TestClaimReadyStepsConcurrentClaimersGetDisjointSets(t *testing.T) {
	t.Parallel()
	concurrentClaims(t, lifecycleSetup(t))
}

func concurrentClaims(t *testing.T, b *lifecycleBundle) {
	const workers, rounds, tasks, perTask, batch = 8, 5, 100, 4, 7
	pool := b.db.NewPool(t, pgtest.MaxConns(workers))
	var all []int64
	for round := range rounds {
		all = b.claimRound(pool, round, workers, tasks, perTask, batch)
	}

	// Every worker tries to start every step (a duplicated dispatch), in its own order.
	started := make([]map[int64]int, workers)
	err := runParallel(b.ctx, pool, workers, func(i int, conn *pgxpool.Conn) error {
		started[i] = map[int64]int{}
		order := append([]int64(nil), all...)
		rng := rand.New(rand.NewPCG(uint64(i), 42))
		rng.Shuffle(len(order), func(x, y int) { order[x], order[y] = order[y], order[x] })
		for _, id := range order {
			var attempt *int
			if err := conn.QueryRow(b.ctx, `SELECT stepready.start_step($1, $2, $3, $4)`,
				id, fmt.Sprintf("w%d", i), testLeaseMs, testBase).Scan(&attempt); err != nil {
				return fmt.Errorf("start_step(%d): %w%s", id, err, errDetail(err))
			}
			if attempt != nil {
				started[i][id] = *attempt
			}
		}
		return nil
	})
	require.NoError(t, err)
	starts := map[int64]int{}
	for _, m := range started {
		for id, attempt := range m {
			require.Equal(t, 1, attempt, "step %d", id)
			starts[id]++
		}
	}
	require.Len(t, starts, len(all))
	for id, n := range starts {
		require.Equal(t, 1, n, "step %d started %d times", id, n)
	}
	require.Equal(t, len(all), b.intCall(`SELECT count(*) FROM stepready.step_events WHERE event = 'attempt.started'`))
	require.Equal(t, len(all), b.intCall(`SELECT count(*) FROM stepready.steps
		WHERE state = 'in_progress' AND attempts = 1`))
}

// startAll runs an attempt of each named step at testBase and returns the attempt numbers.
func (b *lifecycleBundle) startAll(ids map[string]int64, names ...string) map[string]int {
	b.t.Helper()
	out := map[string]int{}
	for _, name := range names {
		out[name] = b.run(ids[name], testBase)
	}
	return out
}

const diamondDefinition = `{"name": "diamond", "steps": [{"name": "a", "handler": "h"},
	{"name": "b", "handler": "h", "depends_on": ["a"]}, {"name": "c", "handler": "h", "depends_on": ["a"]},
	{"name": "d", "handler": "h", "depends_on": ["b", "c"]}]}`

const pairDefinition = `{"name": "pair", "steps": [{"name": "x", "handler": "h"}, {"name": "y", "handler": "h"}]}`

// TestConcurrentCompletionOfTheJoinParents: b's completion is uncommitted while c's completion runs on another
// connection; after both commit the join step d has no pending parent and is ready.
func TestConcurrentCompletionOfTheJoinParents(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, ids := b.task(diamondDefinition)
	b.runToComplete(ids["a"], `{}`, testBase)
	att := b.startAll(ids, "b", "c")

	b.interleave(
		`SELECT stepready.complete_step($1, $2, '{}'::jsonb, $3)`, []any{ids["b"], att["b"], testBase},
		`SELECT stepready.complete_step($1, $2, '{}'::jsonb, $3)`, []any{ids["c"], att["c"], testBase})

	d := b.step(ids["d"])
	require.Equal(t, 0, d.PendingParents)
	require.Equal(t, "pending", d.State)
	b.requireReady(ids["d"], testBase)
	require.Equal(t, []int64{ids["d"]}, b.claimIDs(testBase))
	b.requireStatus(taskID, "in_progress")
}

// TestConcurrentCompletionOfTheLastTwoSteps: the last two steps of a task complete on two connections at once;
// the task ends complete.
func TestConcurrentCompletionOfTheLastTwoSteps(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, ids := b.task(pairDefinition)
	att := b.startAll(ids, "x", "y")

	b.interleave(
		`SELECT stepready.complete_step($1, $2, '{}'::jsonb, $3)`, []any{ids["x"], att["x"], testBase},
		`SELECT stepready.complete_step($1, $2, '{}'::jsonb, $3)`, []any{ids["y"], att["y"], testBase})

	tk := b.taskRow(taskID)
	require.Equal(t, "complete", tk.Status)
	require.NotNil(t, tk.CompletedAt)
}

// interleave runs sqlA in an open transaction on one connection, then sqlB on a second connection, waits
// until sqlB blocks on a lock held by the first, commits the first, and requires both calls to return true.
func (b *lifecycleBundle) interleave(sqlA string, argsA []any, sqlB string, argsB []any) {
	b.t.Helper()
	connA, connB := b.db.Conn(b.t), b.db.Conn(b.t)
	tx, err := connA.Begin(b.ctx)
	require.NoError(b.t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	var okA bool
	require.NoError(b.t, tx.QueryRow(b.ctx, sqlA, argsA...).Scan(&okA))
	require.True(b.t, okA)

	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = connB.QueryRow(b.ctx, sqlB, argsB...).Scan(&r.ok)
		done <- r
	}()
	b.waitBlocked(connB.PgConn().PID())
	require.NoError(b.t, tx.Commit(b.ctx))
	select {
	case r := <-done:
		require.NoError(b.t, r.err)
		require.True(b.t, r.ok)
	case <-time.After(20 * time.Second):
		b.t.Fatal("the second call did not return after the first committed")
	}
}

// TestConcurrentCompletionStress completes the two join parents of many diamonds, and the last two steps of
// many tasks, from two connections released together.
func TestConcurrentCompletionStress(t *testing.T) {
	t.Parallel()
	const n = 30
	b := lifecycleSetup(t)

	type pairOf struct {
		taskID  int64
		ids     map[string]int64
		attempt map[string]int
	}
	diamonds := make([]pairOf, n)
	pairs := make([]pairOf, n)
	for i := range n {
		taskID, ids := b.task(diamondDefinition)
		b.runToComplete(ids["a"], `{}`, testBase)
		diamonds[i] = pairOf{taskID, ids, b.startAll(ids, "b", "c")}
		taskID, ids = b.task(pairDefinition)
		pairs[i] = pairOf{taskID, ids, b.startAll(ids, "x", "y")}
	}

	pool := b.db.NewPool(t, pgtest.MaxConns(2))
	names := [2][2]string{{"b", "x"}, {"c", "y"}}
	err := runParallel(b.ctx, pool, 2, func(g int, conn *pgxpool.Conn) error {
		for i := range n {
			for k, set := range [][]pairOf{diamonds, pairs} {
				p := set[i]
				name := names[g][k]
				var ok bool
				if err := conn.QueryRow(b.ctx, `SELECT stepready.complete_step($1, $2, '{}'::jsonb, $3)`,
					p.ids[name], p.attempt[name], testBase).Scan(&ok); err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("complete_step of %s in task %d refused", name, p.taskID)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)

	for _, d := range diamonds {
		s := b.step(d.ids["d"])
		require.Equal(t, 0, s.PendingParents, "task %d", d.taskID)
		b.requireReady(d.ids["d"], testBase)
		b.requireStatus(d.taskID, "in_progress")
	}
	for _, p := range pairs {
		b.requireStatus(p.taskID, "complete")
	}
	require.Len(t, b.claimIDs(testBase), n, "every join step is claimable")
}

// errDetail returns the detail and context of a PostgreSQL error (for a deadlock: who waited on what).
func errDetail(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	return fmt.Sprintf("\ndetail: %s\nwhere: %s", pgErr.Detail, pgErr.Where)
}

// claimRound adds tasks×perTask ready steps in new pending tasks, has workers connections claim them
// concurrently in batches, checks that the claims are disjoint and cover exactly the new steps, and returns
// the new step ids.
func (b *lifecycleBundle) claimRound(pool *pgxpool.Pool, round, workers, tasks, perTask, batch int) []int64 {
	t := b.t
	t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `
		WITH t AS (INSERT INTO stepready.tasks (name, priority)
		           SELECT 'conc-' || $3::int || '-' || g, g % 3 FROM generate_series(1, $1::int) g RETURNING id),
		     s AS (INSERT INTO stepready.steps (task_id, name, handler, priority)
		           SELECT t.id, 's' || g, 'h', g % 4 FROM t, generate_series(1, $2::int) g RETURNING id)
		SELECT id FROM s ORDER BY id`, tasks, perTask, round)
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, all, tasks*perTask)

	claimed := make([][]int64, workers)
	err = runParallel(b.ctx, pool, workers, func(i int, conn *pgxpool.Conn) error {
		for {
			got, err := b.claimAs(conn, batch, fmt.Sprintf("w%d", i), testLeaseMs, testBase)
			if err != nil {
				return fmt.Errorf("round %d: claim_ready_steps: %w%s", round, err, errDetail(err))
			}
			if len(got) > batch {
				return fmt.Errorf("claimed %d > limit %d", len(got), batch)
			}
			if len(got) == 0 {
				return nil
			}
			claimed[i] = append(claimed[i], claimedIDs(got)...)
		}
	})
	require.NoError(t, err)

	owner := map[int64]int{}
	for i, ids := range claimed {
		for _, id := range ids {
			prev, dup := owner[id]
			require.False(t, dup, "round %d: step %d claimed by w%d and w%d", round, id, prev, i)
			owner[id] = i
		}
	}
	require.Len(t, owner, len(all), "round %d: the union of the claims is every ready step", round)
	for _, id := range all {
		_, ok := owner[id]
		require.True(t, ok, "round %d: step %d was never claimed", round, id)
	}
	require.Empty(t, b.claimIDs(testBase))
	require.Equal(t, len(all), b.intCall(`SELECT count(*) FROM stepready.steps WHERE state = 'enqueued'
		AND id = ANY ($1)`, all))
	require.Equal(t, len(all), b.intCall(`SELECT count(*) FROM stepready.step_events
		WHERE event = 'step.enqueued' AND step_id = ANY ($1)`, all), "one step.enqueued event per step")
	require.Equal(t, tasks, b.intCall(`SELECT count(*) FROM stepready.tasks t
		WHERE status = 'in_progress' AND EXISTS (SELECT 1 FROM stepready.steps s
		WHERE s.task_id = t.id AND s.id = ANY ($1))`, all), "every claimed task is in_progress")
	return all
}
