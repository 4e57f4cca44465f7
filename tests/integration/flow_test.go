package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Flow control (SPEC §14): definition fields, limits in the claim, releases, overrides, token buckets, fairness.

// keyedTasks creates n one-step tasks whose step has the given flow fields (JSON, without braces) and returns
// their step ids in creation order.
func (b *lifecycleBundle) keyedTasks(n int, fields string) []int64 {
	b.t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		_, steps := b.task(fmt.Sprintf(`{"name": "k%d", "steps": [{"name": "s", "handler": "h", %s}]}`, i, fields))
		ids[i] = steps["s"]
	}
	return ids
}

// explainMessages returns the "reason: message" lines explain_step gives for a step at asOf.
func (b *lifecycleBundle) explainMessages(stepID int64, asOf time.Time) []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT reason, message FROM stepready.explain_step($1, $2)`, stepID, asOf)
	require.NoError(b.t, err)
	var got []string
	for rows.Next() {
		var reason, message string
		require.NoError(b.t, rows.Scan(&reason, &message))
		got = append(got, reason+": "+message)
	}
	require.NoError(b.t, rows.Err())
	return got
}

// inFlight is the number of slots of a key taken at testBase: steps in flight, and orphaned leases (a running
// attempt an operator moved out of flight) not expired.
func (b *lifecycleBundle) inFlight(key string) int {
	b.t.Helper()
	return b.intCall(`SELECT stepready._flow_in_flight($1, $2)`, key, testBase)
}

func TestFlowDefinitionFieldsAndPlaceholders(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, ids := b.task(`{"name": "t", "context": {"tenant": {"id": 42}, "flag": true},
		"concurrency": {"key": "tenant:${context.tenant.id}", "limit": 5},
		"rate_limit": {"key": "api", "limit": 10, "period_ms": 1000},
		"steps": [
			{"name": "a", "handler": "h"},
			{"name": "b", "handler": "h", "input": {"api": "github", "n": [1]},
			 "concurrency": {"key": "own-${input.api}-${context.flag}", "limit": 2},
			 "rate_limit": {"key": "api:${input.api}", "limit": 3, "period_ms": 60000}}]}`)
	type cols struct {
		CKey   *string
		CLimit *int
		RKey   *string
		RLimit *int
		RMs    *int64
		Flow   string
	}
	get := func(id int64) cols {
		var c cols
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT concurrency_key, concurrency_limit, rate_key, rate_limit,
			rate_period_ms, flow_key FROM stepready.steps WHERE id = $1`, id).
			Scan(&c.CKey, &c.CLimit, &c.RKey, &c.RLimit, &c.RMs, &c.Flow))
		return c
	}
	require.Equal(t, cols{ptr("tenant:42"), ptr(5), ptr("api"), ptr(10), ptr(int64(1000)), "tenant:42"},
		get(ids["a"]), "the task's fields are the default of its steps")
	require.Equal(t, cols{ptr("own-github-true"), ptr(2), ptr("api:github"), ptr(3), ptr(int64(60000)),
		"own-github-true"}, get(ids["b"]), "a step's own fields win, placeholders resolved")

	// A rate key alone is the fairness key; no key at all is the '' group.
	_, ids = b.task(`{"name": "r", "steps": [{"name": "x", "handler": "h", "rate_limit": {"key": "r", "limit": 1, "period_ms": 1}},
		{"name": "y", "handler": "h"}]}`)
	require.Equal(t, "r", get(ids["x"]).Flow)
	require.Equal(t, "", get(ids["y"]).Flow)

	// Plain SQL: the insert trigger resolves the placeholders too.
	taskID := b.intCall(`INSERT INTO stepready.tasks (name, context) VALUES ('plain', '{"t": "acme"}') RETURNING id::int`)
	var key string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `INSERT INTO stepready.steps (task_id, name, handler, input,
		concurrency_key, concurrency_limit) VALUES ($1, 's', 'h', '{"region": "eu"}', 't:${context.t}:${input.region}', 1)
		RETURNING concurrency_key`, taskID).Scan(&key))
	require.Equal(t, "t:acme:eu", key)

	for _, tc := range []struct {
		name, def string
		contains  []string
	}{
		{"missing context path", `{"name": "t", "steps": [{"name": "s", "handler": "h",
			"concurrency": {"key": "t:${context.tenant}", "limit": 1}}]}`,
			[]string{`steps[0] "s": concurrency: key`, `placeholder "${context.tenant}": no value at that path`}},
		{"missing input path, task default", `{"name": "t", "concurrency": {"key": "${input.who}", "limit": 1},
			"steps": [{"name": "s", "handler": "h"}]}`,
			[]string{`steps[0] "s": concurrency (the task's): key`, `placeholder "${input.who}"`}},
		{"non-scalar value", `{"name": "t", "steps": [{"name": "s", "handler": "h", "input": {"o": {"a": 1}},
			"rate_limit": {"key": "${input.o}", "limit": 1, "period_ms": 1}}]}`,
			[]string{`steps[0] "s": rate_limit: key`, `must be a string, number or boolean, got object`}},
		{"unknown root", `{"name": "t", "steps": [{"name": "s", "handler": "h",
			"concurrency": {"key": "${env.HOME}", "limit": 1}}]}`,
			[]string{`placeholder "${env.HOME}" must be ${context.PATH} or ${input.PATH}`}},
		{"unterminated", `{"name": "t", "steps": [{"name": "s", "handler": "h",
			"concurrency": {"key": "a${input.x", "limit": 1}}]}`,
			[]string{`unterminated placeholder`}},
		{"limit 0", `{"name": "t", "steps": [{"name": "s", "handler": "h", "concurrency": {"key": "k", "limit": 0}}]}`,
			[]string{`steps[0] "s": concurrency: limit`, `must be an integer >= 1`}},
		{"negative limit at task level", `{"name": "t", "concurrency": {"key": "k", "limit": -3},
			"steps": [{"name": "s", "handler": "h"}]}`, []string{`concurrency: limit`, `>= 1`}},
		{"rate without period", `{"name": "t", "steps": [{"name": "s", "handler": "h", "rate_limit": {"key": "k", "limit": 1}}]}`,
			[]string{`steps[0] "s": rate_limit: period_ms`, `is required`}},
		{"unknown field", `{"name": "t", "steps": [{"name": "s", "handler": "h", "concurrency": {"key": "k", "limit": 1, "burst": 2}}]}`,
			[]string{`steps[0] "s": concurrency`, `burst`}},
		{"empty key", `{"name": "t", "steps": [{"name": "s", "handler": "h", "concurrency": {"key": "", "limit": 1}}]}`,
			[]string{`concurrency: key`}},
	} {
		err := b.callErr(`SELECT stepready.create_task($1::jsonb)`, tc.def)
		requireSQLState(t, err, "22023", tc.contains...)
	}
	// Plain SQL: a key without its limit.
	err := b.callErr(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key) VALUES ($1, 'z', 'h', 'k')`, taskID)
	requireSQLState(t, err, "22023", `step "z"`, "concurrency_key and concurrency_limit go together")
}

// A key never has more than its limit in flight; every way out of flight frees a slot at once.
func TestFlowConcurrencyLimitAndEveryRelease(t *testing.T) {
	t.Parallel()
	const fields = `"concurrency": {"key": "k", "limit": 2}, "retry": {"max_attempts": 3, "backoff": "none"}`
	for _, tc := range []struct {
		name    string
		release func(b *lifecycleBundle, stepID int64, asOf time.Time)
	}{
		{"complete", func(b *lifecycleBundle, id int64, at time.Time) {
			require.True(b.t, b.complete(id, b.attemptOf(id), `{}`, at))
		}},
		{"fail with a retry", func(b *lifecycleBundle, id int64, at time.Time) {
			r := b.fail(id, b.attemptOf(id), `{"message": "boom"}`, at, 0)
			require.Equal(b.t, "waiting_for_retry", deref(r.State))
		}},
		{"fail for good", func(b *lifecycleBundle, id int64, at time.Time) {
			b.exec(`UPDATE stepready.steps SET max_attempts = 1 WHERE id = $1`, id)
			r := b.fail(id, b.attemptOf(id), `{"message": "boom"}`, at, 0)
			require.Equal(b.t, "error", deref(r.State))
		}},
		{"release", func(b *lifecycleBundle, id int64, at time.Time) {
			require.True(b.t, b.boolCall(`SELECT stepready.release_step($1, $2, $3)`, id, b.attemptOf(id), at))
		}},
		{"reap", func(b *lifecycleBundle, id int64, at time.Time) {
			b.exec(`UPDATE stepready.steps SET lease_expires_at = $2 WHERE id = $1`, id, at.Add(-time.Second))
			require.Equal(b.t, 1, b.intCall(`SELECT stepready.reap_expired_leases($1)`, at))
		}},
		// A cancelled attempt keeps its slot while its handler may run: until its worker reports...
		{"cancel, then the worker reports", func(b *lifecycleBundle, id int64, at time.Time) {
			attempt := b.attemptOf(id)
			b.exec(`SELECT stepready.cancel_task(task_id, 'no', $2) FROM stepready.steps WHERE id = $1`, id, at)
			require.Equal(b.t, 2, b.inFlight("k"), "the cancelled attempt still holds its slot")
			require.Equal(b.t, "stale_attempt", deref(b.fail(id, attempt, `{"class": "canceled"}`, at, 0).Reason))
		}},
		// ... or its lease expires: the count tests the expiry itself (at the microsecond), the reaper clears it.
		{"cancel, then the lease expires", func(b *lifecycleBundle, id int64, at time.Time) {
			b.exec(`UPDATE stepready.steps SET lease_expires_at = $2 WHERE id = $1`, id, at.Add(time.Minute))
			b.exec(`SELECT stepready.cancel_task(task_id, 'no', $2) FROM stepready.steps WHERE id = $1`, id, at)
			require.Equal(b.t, 2, b.intCall(`SELECT stepready._flow_in_flight('k', $1)`, at.Add(time.Minute)))
			require.Equal(b.t, 1, b.intCall(`SELECT stepready._flow_in_flight('k', $1)`, at.Add(time.Minute+tick)))
			b.exec(`UPDATE stepready.steps SET lease_expires_at = $2 WHERE id = $1`, id, at.Add(-time.Second))
			require.Equal(b.t, 1, b.intCall(`SELECT stepready.reap_expired_leases($1)`, at))
			require.Nil(b.t, b.step(id).LeaseExpiresAt)
		}},
		{"resolve, then the worker reports", func(b *lifecycleBundle, id int64, at time.Time) {
			attempt := b.attemptOf(id)
			b.exec(`SELECT stepready.resolve_step($1, '{}', $2)`, id, at)
			require.Equal(b.t, 2, b.inFlight("k"), "the resolved attempt still holds its slot")
			require.False(b.t, b.complete(id, attempt, `{}`, at))
		}},
		{"delete (prune)", func(b *lifecycleBundle, id int64, _ time.Time) {
			b.exec(`DELETE FROM stepready.tasks WHERE id = (SELECT task_id FROM stepready.steps WHERE id = $1)`, id)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			ids := b.keyedTasks(5, fields)
			at := testBase
			got := b.startIDs(10, at)
			require.Equal(t, ids[:2], got, "two of five: the limit")
			require.Equal(t, 2, b.inFlight("k"))
			b.requireNotReady(ids[2], at, "concurrency_limited")
			require.Equal(t, []string{"concurrency_limited: concurrency limited by k: 2 of 2 in flight"},
				b.explainMessages(ids[2], at))
			require.Empty(t, b.startIDs(10, at), "nothing more while the key is full")

			tc.release(b, ids[0], at)
			require.Equal(t, 1, b.inFlight("k"))
			b.requireReady(ids[2], at)
			got = b.startIDs(10, at)
			require.Len(t, got, 1, "exactly one slot was freed")
			require.Equal(t, 2, b.inFlight("k"))
		})
	}
}

// Reset (after cancel or failure) puts steps back as pending: they count again only when claimed.
func TestFlowResetAndOverrides(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	ids := b.keyedTasks(6, `"concurrency": {"key": "k", "limit": 3}`)
	at := testBase
	require.Len(t, b.startIDs(10, at), 3)

	// An operator lowers the limit: no claim until in flight drops below it.
	b.exec(`SELECT stepready.set_flow_limit('k', 1)`)
	require.Empty(t, b.startIDs(10, at))
	require.Equal(t, []string{"concurrency_limited: concurrency limited by k: 3 of 1 in flight"},
		b.explainMessages(ids[3], at))
	for _, id := range ids[:3] {
		require.True(t, b.complete(id, b.attemptOf(id), `{}`, at))
	}
	require.Len(t, b.startIDs(10, at), 1, "the override holds")
	// Raising it takes effect at the next claim; clearing it restores the steps' own limit.
	b.exec(`SELECT stepready.set_flow_limit('k', 2)`)
	require.Len(t, b.startIDs(10, at), 1)
	require.True(t, b.boolCall(`SELECT stepready.clear_flow_limit('k')`))
	require.False(t, b.boolCall(`SELECT stepready.clear_flow_limit('k')`))
	require.Len(t, b.startIDs(10, at), 1, "the steps' own limit of 3")
	require.Equal(t, 3, b.inFlight("k"))

	// Bad overrides are refused with the key named.
	for _, sql := range []string{
		`SELECT stepready.set_flow_limit('k', 0)`,
		`SELECT stepready.set_flow_limit('k', NULL, 5)`,
		`SELECT stepready.set_flow_limit('k')`,
		`SELECT stepready.set_flow_limit('', 1)`,
		`SELECT stepready.set_flow_limit('k', NULL, 0, 1000)`,
	} {
		requireSQLState(t, b.callErr(sql), "22023")
	}

	// Cancel and reset: the cancelled in-flight step keeps its slot while its attempt may still run, and the reset
	// step waits for that attempt to end (never two runs of one step); the old worker's report ends both.
	taskOf := b.intCall(`SELECT task_id::int FROM stepready.steps WHERE id = $1`, ids[3])
	old := b.attemptOf(ids[3])
	b.exec(`SELECT stepready.cancel_task($1, NULL, $2)`, taskOf, at)
	require.Equal(t, 3, b.inFlight("k"))
	require.Equal(t, 1, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskOf, at))
	b.requireNotReady(ids[3], at, "in_flight")
	require.Empty(t, b.startIDs(10, at))
	require.False(t, b.complete(ids[3], old, `{}`, at))
	require.Equal(t, 2, b.inFlight("k"))
	b.requireReady(ids[3], at)
	require.Equal(t, ids[3:4], b.startIDs(10, at))
	require.Equal(t, 3, b.inFlight("k"))
}

// The token bucket at the exact boundary of p_as_of: 2 per second is a token every 500 ms, a burst of 2.
func TestFlowRateBoundary(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	ids := b.keyedTasks(6, `"rate_limit": {"key": "api", "limit": 2, "period_ms": 1000}`)
	t0 := testBase
	require.Equal(t, ids[:2], b.startIDs(10, t0), "a full bucket: a burst of two")
	b.requireNotReady(ids[2], t0, "rate_limited")
	require.Equal(t, []string{"rate_limited: rate limited by api: next slot in 0.5s"}, b.explainMessages(ids[2], t0))

	var next *time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.next_claim_at($1)`, t0).Scan(&next))
	requireTime(t, t0.Add(500*time.Millisecond), next, "next_claim_at: the next token")

	require.Empty(t, b.startIDs(10, t0.Add(500*time.Millisecond-tick)), "1 µs before the token")
	b.requireNotReady(ids[2], t0.Add(500*time.Millisecond-tick), "rate_limited")
	b.requireReady(ids[2], t0.Add(500*time.Millisecond))
	require.Equal(t, ids[2:3], b.startIDs(10, t0.Add(500*time.Millisecond)), "one token at 500 ms")
	require.Empty(t, b.startIDs(10, t0.Add(999*time.Millisecond)))
	require.Equal(t, ids[3:4], b.startIDs(10, t0.Add(time.Second)))
	// Idle for 10 s: the bucket holds at most its capacity.
	require.Equal(t, ids[4:6], b.startIDs(10, t0.Add(11*time.Second)))

	// An override of the rate applies at the next claim.
	more := b.keyedTasks(3, `"rate_limit": {"key": "api", "limit": 2, "period_ms": 1000}`)
	b.exec(`SELECT stepready.set_flow_limit('api', NULL, 1, 10000)`)
	require.Equal(t, more[:1], b.startIDs(10, t0.Add(20*time.Second)))
	require.Empty(t, b.startIDs(10, t0.Add(29*time.Second)))
	require.Equal(t, more[1:2], b.startIDs(10, t0.Add(30*time.Second)))

	var status struct {
		Key      string
		Tokens   float64
		Next     *time.Time
		Waiting  int
		Override bool
		Blocked  *string
	}
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT key, tokens, next_token_at, waiting, overridden, blocked
		FROM stepready.flow_status($1) WHERE key = 'api'`, t0.Add(35*time.Second)).
		Scan(&status.Key, &status.Tokens, &status.Next, &status.Waiting, &status.Override, &status.Blocked))
	require.InDelta(t, 0.5, status.Tokens, 1e-9)
	requireTime(t, t0.Add(40*time.Second), status.Next, "next token")
	require.Equal(t, 1, status.Waiting)
	require.True(t, status.Override)
	require.Equal(t, "rate_limited", deref(status.Blocked))
}

// A token whose time is not a whole microsecond (3 per second: one every 333,333.33 µs) is there at the same
// microsecond for readiness, explain, flow_status and the claim: the first microsecond at or after it. A claim
// that finds no token records that microsecond as the key's wake-up. (The next token's time used to be rounded to
// the nearest microsecond: 1 µs before the claim allowed the start, readiness said ready, the claim took nothing
// and recorded no wake-up.)
func TestFlowRateTokenAtAFractionalMicrosecond(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	ids := b.keyedTasks(5, `"rate_limit": {"key": "api", "limit": 3, "period_ms": 1000}`)
	t0 := testBase
	require.Equal(t, ids[:3], b.startIDs(10, t0), "a full bucket: a burst of three")
	// Three starts moved the bucket's tat to t0 + 999,999 µs (each start adds 333,333.33 µs, rounded to the
	// microsecond); with a tolerance of 666,666.67 µs the fourth start is allowed from t0 + 333,332.33 µs, that is
	// from the microsecond t0 + 333,333 µs.
	require.Equal(t, 999999, b.intCall(`SELECT (extract(epoch FROM rate_tat - $1) * 1000000)::int
		FROM stepready.flow_state WHERE key = 'api'`, t0))
	token := t0.Add(333333 * time.Microsecond)
	before := token.Add(-tick)
	b.requireNotReady(ids[3], before, "rate_limited")
	var next *time.Time
	var blocked *string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT next_token_at, blocked FROM stepready.flow_status($1)
		WHERE key = 'api'`, before).Scan(&next, &blocked))
	requireTime(t, token, next, "flow_status: the next token")
	require.Equal(t, "rate_limited", deref(blocked))
	require.Empty(t, b.startIDs(10, before), "1 µs before the token")
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.next_claim_at($1)`, before).Scan(&next))
	requireTime(t, token, next, "the wake-up the claim recorded")

	b.requireReady(ids[3], token)
	require.Equal(t, ids[3:4], b.startIDs(10, token), "one token at its microsecond")
	b.requireNotReady(ids[4], token, "rate_limited")
}

// flow_status reads a bounded number of steps whatever the backlog: each key with steps waiting is found by one
// probe of the claim index and its waiting steps counted up to an equal share of _read_budget(); a key with more
// says so (waiting_capped) with its share as a lower bound. Steps without a key are not read (the exact version read
// every claimable row, keyed or not: 270-510 ms with 1,000,000).
func TestFlowStatusBoundedRead(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	budget := b.intCall(`SELECT stepready._read_budget()`)
	b.exec(`INSERT INTO stepready.tasks (name) VALUES ('t')`)
	b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
		SELECT 1, 'b' || g, 'h', 'big', 7 FROM generate_series(1, $1) g`, 3*budget)
	b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
		SELECT 1, 'f' || g, 'h', 'few', 2 FROM generate_series(1, 3) g`)
	b.exec(`INSERT INTO stepready.steps (task_id, name, handler) SELECT 1, 'u' || g, 'h' FROM generate_series(1, $1) g`,
		2*budget)
	b.exec(`VACUUM ANALYZE stepready.steps`)

	conn := b.db.Conn(t)
	before := stepsTuplesRead(t, conn)
	rows, err := conn.Query(b.ctx, `SELECT key, concurrency_limit, waiting, waiting_capped, blocked
		FROM stepready.flow_status($1)`, testBase)
	require.NoError(t, err)
	type row struct {
		Key     string
		Limit   *int
		Waiting int
		Capped  bool
		Blocked *string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	read := stepsTuplesRead(t, conn) - before
	t.Logf("flow_status: %+v, %d tuples of steps read", got, read)
	require.Equal(t, []row{
		{Key: "big", Limit: ptr(7), Waiting: budget / 2, Capped: true},
		{Key: "few", Limit: ptr(2), Waiting: 3},
	}, got, "two keys: a share of half the budget each; limits of keys never claimed from their waiting steps")
	require.LessOrEqual(t, read, int64(budget+100), "flow_status read the backlog")

	// Once the big key is full, it is blocked; the count stays bounded.
	b.exec(`UPDATE stepready.steps SET state = 'in_progress', attempts = 1, lease_owner = 'w', lease_expires_at = $1
		WHERE id IN (SELECT id FROM stepready.steps WHERE concurrency_key = 'big' ORDER BY id LIMIT 7)`,
		testBase.Add(time.Minute))
	var blocked *string
	var inFlight int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT in_flight, blocked FROM stepready.flow_status($1)
		WHERE key = 'big'`, testBase).Scan(&inFlight, &blocked))
	require.Equal(t, 7, inFlight)
	require.Equal(t, "concurrency_limited", deref(blocked))
}

// Fairness across claims: a key with 2,000 ready steps created first does not starve a key with 20 created
// after, even when every claim takes one or two steps.
func TestFlowFairnessAcrossClaims(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 2, 7} {
		t.Run(fmt.Sprintf("claims of %d", batch), func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			b.exec(`INSERT INTO stepready.tasks (name) VALUES ('big'), ('small')`)
			b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
				SELECT 1, 'b' || g, 'h', 'big', 100000 FROM generate_series(1, 2000) g`)
			b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
				SELECT 2, 's' || g, 'h', 'small', 100000 FROM generate_series(1, 20) g`)
			bigStarts, smallStarts := 0, 0
			for smallStarts < 20 {
				rows := b.claim(batch, testBase)
				require.NotEmpty(t, rows)
				for _, r := range rows {
					if r.TaskID == 1 {
						bigStarts++
					} else {
						smallStarts++
					}
				}
				require.LessOrEqual(t, bigStarts, 2*20+batch,
					"the big key took %d starts before the small key's 20 were done (%d done)", bigStarts, smallStarts)
			}
		})
	}
}

// Fairness across claimers (issue 28): two claimers that each hold at most two steps and claim as their slots free
// up (claims of one or two steps, concurrent, each its own transaction, as two daemons of concurrency 2 do), with a
// key of 1,000 ready steps, then a key of 20 that arrives behind them. The busy key gets at most its fair share of
// starts (one per start of the small key, with the same slack as one claimer) until the small key's 20 started.
func TestFlowFairnessAcrossClaimers(t *testing.T) {
	t.Parallel()
	// The small key sorts after and before the busy one: the ring wraps between them or not.
	for _, keys := range [][2]string{{"busy", "small"}, {"zbusy", "asmall"}} {
		t.Run(keys[1], func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			b.exec(`INSERT INTO stepready.tasks (name) VALUES ('busy'), ('small')`)
			b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
				SELECT 1, 'b' || g, 'h', $1, 100000 FROM generate_series(1, 1000) g`, keys[0])
			ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
			defer cancel()
			var mu sync.Mutex
			var starts []int64 // task ids in the order their claims returned
			arrived, smallStarts := -1, 0
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			for c := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					worker := fmt.Sprintf("w%d", c)
					type held struct {
						id      int64
						attempt int
					}
					var running []held
					for ctx.Err() == nil {
						mu.Lock()
						done := smallStarts >= 20
						arrive := arrived < 0 && len(starts) >= 10
						if arrive {
							arrived = len(starts)
						}
						mu.Unlock()
						if done {
							return
						}
						if arrive {
							if _, err := b.db.Pool.Exec(ctx, `INSERT INTO stepready.steps (task_id, name, handler,
								concurrency_key, concurrency_limit)
								SELECT 2, 's' || g, 'h', $1, 100000 FROM generate_series(1, 20) g`, keys[1]); err != nil {
								errs <- err
								return
							}
						}
						rows, err := b.db.Pool.Query(ctx, `SELECT step_id, task_id, attempt
							FROM stepready.claim_and_start_steps($1, $2, 60000, $3)`, 2-len(running), worker, testBase)
						if err != nil {
							errs <- err
							return
						}
						var id, task int64
						var attempt int
						_, err = pgx.ForEachRow(rows, []any{&id, &task, &attempt}, func() error {
							running = append(running, held{id, attempt})
							mu.Lock()
							starts = append(starts, task)
							if task == 2 {
								smallStarts++
							}
							mu.Unlock()
							return nil
						})
						if err != nil {
							errs <- err
							return
						}
						// The oldest attempt ends: a slot is free again.
						if len(running) > 0 {
							if _, err := b.db.Pool.Exec(ctx, `SELECT stepready.complete_step($1, $2, '{}', $3)`,
								running[0].id, running[0].attempt, testBase); err != nil {
								errs <- err
								return
							}
							running = running[1:]
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.NoError(t, ctx.Err())
			busyStarts := 0
			for _, task := range starts[arrived:] {
				if task == 1 {
					busyStarts++
				}
			}
			t.Logf("busy starts while the small key's 20 started: %d (%v)", busyStarts, starts[arrived:])
			require.LessOrEqual(t, busyStarts, 2*20+2,
				"the busy key took %d starts before the small key's 20 were done", busyStarts)
		})
	}
}

// Priorities first: keys are only shared within one (task priority, step priority) group.
func TestFlowFairnessKeepsPriorities(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	low := b.keyedTasks(3, `"concurrency": {"key": "a", "limit": 10}`)
	high := b.keyedTasks(2, `"priority": 5, "concurrency": {"key": "b", "limit": 10}`)
	plain := b.keyedTasks(2, `"priority": 5`)
	got := b.startIDs(4, testBase)
	require.ElementsMatch(t, append(append([]int64{}, high...), plain...), got)
	require.Equal(t, low[:3], b.startIDs(10, testBase))
}

// Eight claimers on one key never put more than its limit in flight, not even for an instant: a sampler reads
// the committed in-flight count all along. Both claim functions.
func TestFlowConcurrentClaimersNeverExceedTheLimit(t *testing.T) {
	t.Parallel()
	for _, fn := range []string{"claim_ready_steps", "claim_and_start_steps"} {
		t.Run(fn, func(t *testing.T) {
			t.Parallel()
			const limit, steps, claimers = 3, 300, 8
			b := lifecycleSetup(t)
			b.exec(`INSERT INTO stepready.tasks (name) VALUES ('t')`)
			b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
				SELECT 1, 's' || g, 'h', 'k', $1 FROM generate_series(1, $2) g`, limit, steps)
			ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
			defer cancel()
			var done, maxSeen atomic.Int64
			stop := make(chan struct{})
			var sampler sync.WaitGroup
			sampler.Add(1)
			go func() {
				defer sampler.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					var n int64
					if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps
						WHERE concurrency_key = 'k' AND state IN ('enqueued', 'in_progress')`).Scan(&n); err != nil {
						return
					}
					for cur := maxSeen.Load(); n > cur && !maxSeen.CompareAndSwap(cur, n); cur = maxSeen.Load() {
					}
				}
			}()
			var wg sync.WaitGroup
			errs := make(chan error, claimers)
			for w := range claimers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					worker := fmt.Sprintf("w%d", w)
					for done.Load() < steps && ctx.Err() == nil {
						rows, err := b.db.Pool.Query(ctx, fmt.Sprintf(
							`SELECT step_id FROM stepready.%s(2, $1, 60000)`, fn), worker)
						if err != nil {
							errs <- err
							return
						}
						var ids []int64
						for rows.Next() {
							var id int64
							_ = rows.Scan(&id)
							ids = append(ids, id)
						}
						if err := rows.Err(); err != nil {
							errs <- err
							return
						}
						for _, id := range ids {
							if fn == "claim_ready_steps" {
								if _, err := b.db.Pool.Exec(ctx, `SELECT stepready.start_step($1, $2, 60000)`, id, worker); err != nil {
									errs <- err
									return
								}
							}
							if _, err := b.db.Pool.Exec(ctx, `SELECT stepready.complete_step($1, 1, '{}')`, id); err != nil {
								errs <- err
								return
							}
							done.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			close(stop)
			sampler.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.EqualValues(t, steps, done.Load(), "every step ran once")
			require.EqualValues(t, steps, b.intCall(`SELECT count(*)::int FROM stepready.steps WHERE state = 'complete'`))
			require.LessOrEqual(t, maxSeen.Load(), int64(limit), "committed in-flight count never above the limit")
			require.Positive(t, maxSeen.Load())
		})
	}
}

// startIDs claims with claim_and_start_steps at asOf and returns the step ids in claim order.
func (b *lifecycleBundle) startIDs(limit int, asOf time.Time) []int64 {
	b.t.Helper()
	return startedIDs(b.claimAndStart(limit, asOf))
}

// attemptOf is the fencing token of a step's current (or last started) attempt.
func (b *lifecycleBundle) attemptOf(stepID int64) int {
	b.t.Helper()
	return b.intCall(`SELECT fence_token FROM stepready.steps WHERE id = $1`, stepID)
}

// A keyed claim reads about as many index entries and rows as the keys it visits, whatever the table holds: the
// same claim of 20 steps over 20 of 200 keys reads the same with 50 or 500 steps per key (a scan would read ten
// times more).
func TestFlowClaimCostFollowsKeysVisited(t *testing.T) {
	t.Parallel()
	read := func(perKey int) int64 {
		b := lifecycleSetup(t)
		b.exec(`INSERT INTO stepready.tasks (name) VALUES ('t')`)
		b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
			SELECT 1, 's' || g, 'h', 'k' || lpad((g % 200)::text, 3, '0'), 100 FROM generate_series(1, $1) g`, 200*perKey)
		b.exec(`VACUUM ANALYZE stepready.steps`)
		conn := b.db.Conn(t)
		// Once to create the keys' flow_state rows and plan the statements.
		_, err := conn.Exec(b.ctx, `BEGIN; SELECT count(*) FROM stepready.claim_ready_steps(20, 'w', 60000); ROLLBACK`)
		require.NoError(t, err)
		before := stepsTuplesRead(t, conn)
		var n int
		require.NoError(t, conn.QueryRow(b.ctx, `SELECT count(*) FROM stepready.claim_ready_steps(20, 'w', 60000)`).Scan(&n))
		require.Equal(t, 20, n)
		return stepsTuplesRead(t, conn) - before
	}
	small, large := read(50), read(500)
	t.Logf("tuples of steps read by a claim of 20 over 20 keys: %d with 10,000 steps, %d with 100,000", small, large)
	require.LessOrEqual(t, large, 2*small+50, "a keyed claim read more as the table grew")
	require.LessOrEqual(t, large, int64(20*20), "a keyed claim read far more than the keys it visits")
}

// A keyed claim never scans the table, even with statistics taken while every row was claimable and keyed: with
// such statistics "is there a keyed row in this group?" was once planned as a sequential scan that stops at the
// first match, reading every finished row before the first claimable one (thousands per claim in scenario 9b).
func TestFlowClaimIgnoresFinishedRows(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	b.exec(`INSERT INTO stepready.tasks (name) VALUES ('t')`)
	b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
		SELECT 1, 's' || g, 'h', 'k' || (g % 20), 1000 FROM generate_series(1, 4000) g`)
	b.exec(`VACUUM ANALYZE stepready.steps`)
	// 3,900 of them run (the oldest of every key), the statistics untouched.
	for range 4 {
		b.exec(`WITH c AS (SELECT step_id, attempt FROM stepready.claim_and_start_steps(975, 'w', 60000))
			SELECT stepready.complete_steps(array_agg(step_id), array_agg(attempt),
				array_fill('{}'::jsonb, ARRAY[count(*)::int])) FROM c`)
	}
	require.Equal(t, 100, b.intCall(`SELECT count(*)::int FROM stepready.steps WHERE state = 'pending'`))
	conn := b.db.Conn(t)
	seqRead := func() int64 {
		_, err := conn.Exec(b.ctx, `SELECT pg_catalog.pg_stat_force_next_flush()`)
		require.NoError(t, err)
		var n int64
		require.NoError(t, conn.QueryRow(b.ctx, `SELECT COALESCE(seq_tup_read, 0) FROM pg_catalog.pg_stat_user_tables
			WHERE schemaname = 'stepready' AND relname = 'steps'`).Scan(&n))
		return n
	}
	before := seqRead()
	var n int
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT count(*) FROM stepready.claim_ready_steps(20, 'w', 60000)`).Scan(&n))
	require.Equal(t, 20, n)
	require.Zero(t, seqRead()-before, "a keyed claim scanned the table")
}

// flowKeys lists the keys that have a flow_state row.
func (b *lifecycleBundle) flowKeys() []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT key FROM stepready.flow_state ORDER BY key`)
	require.NoError(b.t, err)
	var keys []string
	for rows.Next() {
		var k string
		require.NoError(b.t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(b.t, rows.Err())
	return keys
}

// prune_flow_state deletes the rows of idle keys only: nothing in flight, bucket full at p_as_of (the exact
// boundary), no wake-up pending, not locked by a claim. A pruned key's next claim starts from a fresh row with
// its limits intact and no token more than the old row would have given; overrides survive.
func TestFlowPruneIdleKeys(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	busy := b.keyedTasks(2, `"concurrency": {"key": "busy", "limit": 1}`)
	done := b.keyedTasks(1, `"concurrency": {"key": "done", "limit": 1}`)
	rated := b.keyedTasks(6, `"rate_limit": {"key": "api", "limit": 2, "period_ms": 1000}`)
	got := b.startIDs(10, t0)
	require.ElementsMatch(t, []int64{busy[0], done[0], rated[0], rated[1]}, got, "one of busy, one of done, two tokens of api")
	require.True(t, b.complete(done[0], b.attemptOf(done[0]), `{}`, t0))
	b.exec(`SELECT stepready.set_flow_limit('done', 5)`)
	// An idle key with a wake-up still pending, and an idle key a claim holds.
	b.exec(`INSERT INTO stepready.flow_state (key, wake_at) VALUES ('waking', $1), ('held', NULL)`, t0.Add(time.Minute))
	require.Equal(t, []string{"api", "busy", "done", "held", "waking"}, b.flowKeys())

	holder, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(b.ctx) }()
	_, err = holder.Exec(b.ctx, `SELECT 1 FROM stepready.flow_state WHERE key = 'held' FOR UPDATE`)
	require.NoError(t, err)

	// api's two tokens refill at t0 + 1 s: 1 µs before, its row is state worth keeping.
	require.Equal(t, 1, b.intCall(`SELECT stepready.prune_flow_state($1)`, t0.Add(time.Second-time.Microsecond)))
	require.Equal(t, []string{"api", "busy", "held", "waking"}, b.flowKeys(), "only done was idle")
	require.NoError(t, holder.Rollback(b.ctx))
	require.Equal(t, 1, b.intCall(`SELECT stepready.prune_flow_state($1, 1)`, t0.Add(time.Second)), "the limit")
	require.Equal(t, 1, b.intCall(`SELECT stepready.prune_flow_state($1)`, t0.Add(time.Second)))
	require.Equal(t, []string{"busy", "waking"}, b.flowKeys(), "api's bucket is full again; held is free")
	require.Equal(t, 1, b.intCall(`SELECT count(*)::int FROM stepready.flow_limits WHERE key = 'done'`), "override kept")

	// The pruned keys' next claims: api gives its two tokens and no more, busy still holds its limit of 1.
	at := t0.Add(time.Second)
	got = b.startIDs(10, at)
	require.ElementsMatch(t, rated[2:4], got)
	b.requireNotReady(rated[4], at, "rate_limited")
	b.requireNotReady(busy[1], at, "concurrency_limited")
	require.Equal(t, []string{"api", "busy", "waking"}, b.flowKeys(), "api's row is back")

	// Done's steps, created after its row was pruned, meet its override of 5.
	more := b.keyedTasks(7, `"concurrency": {"key": "done", "limit": 1}`)
	require.Equal(t, more[:5], b.startIDs(10, at))

	for _, sql := range []string{
		`SELECT stepready.prune_flow_state(NULL)`,
		`SELECT stepready.prune_flow_state(now(), -1)`,
		`SELECT stepready.prune_flow_state(now(), NULL)`,
	} {
		requireSQLState(t, b.callErr(sql), "22023")
	}
	require.Zero(t, b.intCall(`SELECT stepready.prune_flow_state(now(), 0)`))
}
