package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// chainDefinition is the task of scenarios 3 and 7: four no-op steps in a line, s1 → s2 → s3 → s4.
var chainDefinition = json.RawMessage(`{"name": "chain", "steps": [
	{"name": "s1", "handler": "noop"},
	{"name": "s2", "handler": "noop", "depends_on": ["s1"]},
	{"name": "s3", "handler": "noop", "depends_on": ["s2"]},
	{"name": "s4", "handler": "noop", "depends_on": ["s3"]}]}`)

const (
	// chainLength is the number of steps of chainDefinition, and of hops of the NOTIFY relay baseline.
	chainLength = 4
	// latencyWarmup chains (and relays) run first and are not counted.
	latencyWarmup = 5
	// latencyPollInterval is the daemon's fallback poll during scenario 3: long enough that only a
	// notification (or the daemon's own freed-capacity signal) can start a step in time.
	latencyPollInterval = 10 * time.Second
	// latencyPollOnlyInterval is the daemon's poll during scenario 3 with Options.PollOnly: no notification
	// wakes it, so the poll interval (and the timer of due steps) carries the latency.
	latencyPollOnlyInterval = 100 * time.Millisecond
	// latencyTaskLimit bounds the wait for one chain; a chain that needs the fallback poll still makes it.
	latencyTaskLimit = 30 * time.Second
)

// chainTimes are the database-clock durations of scenario 3.
type chainTimes struct {
	// chain is, per task, tasks.created_at → tasks.completed_at.
	chain []time.Duration
	// handoff is, per dependency edge, the parent's completed_at → the child's last_attempted_at (the start of
	// its only attempt).
	handoff []time.Duration
}

// chainLatency creates n chain tasks one at a time, each once the previous one is complete, and works them with a
// Client in the given dispatch mode whose poll interval is latencyPollInterval. Both ends of every duration
// come from the database's clock: created_at and completed_at are the now() of the creating and completing
// transactions, last_attempted_at the now() of start_step's.
func chainLatency(ctx context.Context, env *Env, n int, mode string) (chainTimes, error) {
	pool, _, err := env.NewDB(ctx, 20)
	if err != nil {
		return chainTimes{}, err
	}
	defer pool.Close()
	// The last step's handler says which task is about to complete, so that the loop below polls the database
	// only for the last few milliseconds of each chain rather than all the time.
	last := make(chan int64, 1)
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
		if s.Name == "s4" {
			select {
			case last <- s.TaskID:
			default:
			}
		}
		return nil, nil
	}))
	poll := latencyPollInterval
	if env.Options.PollOnly {
		poll = latencyPollOnlyInterval
	}
	c, err := stepready.NewClient(pool, stepready.Config{Registry: reg, Dispatch: mode, Concurrency: 10,
		PollInterval: poll, PollOnly: env.Options.PollOnly, Logger: env.Logger.With("component", "client")})
	if err != nil {
		return chainTimes{}, err
	}
	if err := c.Start(ctx); err != nil {
		return chainTimes{}, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = c.Stop(stopCtx)
	}()

	var ids []int64
	for i := range latencyWarmup + n {
		id, err := stepready.CreateTask(ctx, pool, chainDefinition)
		if err != nil {
			return chainTimes{}, err
		}
		if err := waitChain(ctx, pool, id, last); err != nil {
			return chainTimes{}, err
		}
		if i >= latencyWarmup {
			ids = append(ids, id)
		}
	}
	return chainDurations(ctx, pool, ids)
}

// waitChain waits until task id is complete: first for its last step's handler to run, then polling the task
// every millisecond.
func waitChain(ctx context.Context, pool *pgxpool.Pool, id int64, last <-chan int64) error {
	deadline := time.NewTimer(latencyTaskLimit)
	defer deadline.Stop()
	for seen := int64(0); seen != id; {
		select {
		case seen = <-last:
		case <-deadline.C:
			return fmt.Errorf("chain task %d: its last step did not run within %s", id, latencyTaskLimit)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	limit := time.Now().Add(latencyTaskLimit)
	for {
		var status string
		if err := pool.QueryRow(ctx, `SELECT status FROM stepready.tasks WHERE id = $1`, id).Scan(&status); err != nil {
			return fmt.Errorf("chain task %d: %w", id, err)
		}
		switch {
		case status == "complete":
			return nil
		case status != "in_progress":
			return fmt.Errorf("chain task %d ended %s, want complete", id, status)
		case time.Now().After(limit):
			return fmt.Errorf("chain task %d: not complete %s after its last step ran", id, latencyTaskLimit)
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// chainDurations reads the durations of scenario 3 for the given tasks from the database, after checking that
// each of their steps completed at its first attempt (a retry would measure something else).
func chainDurations(ctx context.Context, pool *pgxpool.Pool, ids []int64) (chainTimes, error) {
	var bad int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps
		WHERE task_id = ANY($1) AND (state <> 'complete' OR attempts <> 1)`, ids).Scan(&bad); err != nil {
		return chainTimes{}, err
	}
	if bad > 0 {
		return chainTimes{}, fmt.Errorf("%d chain steps did not complete at their first attempt", bad)
	}
	var t chainTimes
	var err error
	if t.chain, err = durations(ctx, pool, `SELECT (extract(epoch FROM completed_at - created_at) * 1e6)::bigint
		FROM stepready.tasks WHERE id = ANY($1)`, ids); err != nil {
		return chainTimes{}, err
	}
	if t.handoff, err = durations(ctx, pool, `SELECT (extract(epoch FROM c.last_attempted_at - p.completed_at) * 1e6)::bigint
		FROM stepready.steps p
		JOIN stepready.step_edges e ON e.parent_step_id = p.id
		JOIN stepready.steps c ON c.id = e.child_step_id
		WHERE p.task_id = ANY($1)`, ids); err != nil {
		return chainTimes{}, err
	}
	if len(t.chain) != len(ids) || len(t.handoff) != len(ids)*(chainLength-1) {
		return chainTimes{}, fmt.Errorf("read %d chain and %d hand-off durations for %d tasks", len(t.chain),
			len(t.handoff), len(ids))
	}
	return t, nil
}

// durations runs a query returning one column of microseconds.
func durations(ctx context.Context, pool *pgxpool.Pool, query string, args ...any) ([]time.Duration, error) {
	rows, err := pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	us, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	ds := make([]time.Duration, len(us))
	for i, u := range us {
		ds[i] = time.Duration(u) * time.Microsecond
	}
	return ds, nil
}

// notifyRelay is the baseline of scenario 3: the least a chain of chainLength hand-offs through LISTEN/NOTIFY
// can cost on this cluster. Each hop commits an INSERT that calls pg_notify (one statement, autocommit) on one
// connection and waits until a second connection, which LISTENs, receives the notification; the next hop starts
// then. It returns the n hop times and the n times of chainLength hops in a row, on the Go clock (both ends are
// in this process).
func notifyRelay(ctx context.Context, env *Env, n int) (hops, relays []time.Duration, err error) {
	pool, _, err := env.NewDB(ctx, 1)
	if err != nil {
		return nil, nil, err
	}
	pool.Close()
	// Straight to the server even with Options.PgBouncer: a transaction pooler cannot LISTEN, and the baseline is
	// what NOTIFY costs on this cluster.
	url := env.directURL()
	writer, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = writer.Close(context.WithoutCancel(ctx)) }()
	listener, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = listener.Close(context.WithoutCancel(ctx)) }()
	if _, err := writer.Exec(ctx, `CREATE TABLE bench_relay (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		hop int NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, nil, err
	}
	if _, err := listener.Exec(ctx, `LISTEN bench_relay`); err != nil {
		return nil, nil, err
	}
	for i := range latencyWarmup + n {
		begin := time.Now()
		for h := range chainLength {
			t := time.Now()
			if _, err := writer.Exec(ctx, `WITH r AS (INSERT INTO bench_relay (hop) VALUES ($1) RETURNING id)
				SELECT pg_notify('bench_relay', id::text) FROM r`, h); err != nil {
				return nil, nil, fmt.Errorf("relay: %w", err)
			}
			waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := listener.WaitForNotification(waitCtx)
			cancel()
			if err != nil {
				return nil, nil, fmt.Errorf("relay: wait for the notification: %w", err)
			}
			if i >= latencyWarmup {
				hops = append(hops, time.Since(t))
			}
		}
		if i >= latencyWarmup {
			relays = append(relays, time.Since(begin))
		}
	}
	return hops, relays, nil
}

func latency(ctx context.Context, env *Env, size Size) ([]Row, error) {
	n := size.LatencyTasks
	hops, relays, err := notifyRelay(ctx, env, n)
	if err != nil {
		return nil, err
	}
	hopP50, relayP50, relayP99 := percentile(hops, 50), percentile(relays, 50), percentile(relays, 99)
	var rows []Row
	for _, m := range []struct{ label, mode string }{
		{"(a) direct", stepready.DispatchDirect},
		{"(b) River", stepready.DispatchRiver},
	} {
		t, err := chainLatency(ctx, env, n, m.mode)
		if err != nil {
			return nil, fmt.Errorf("%s dispatch: %w", m.label, err)
		}
		row := func(figure string, v time.Duration, base string, bv time.Duration, target time.Duration) Row {
			return Row{Scenario: "3 latency", Figure: m.label + " dispatch" + env.Options.label() + ", " + figure,
				Value: millis(v), Unit: "ms",
				Baseline: base, BaseVal: millis(bv), Ratio: float64(v) / float64(bv),
				Target: fmt.Sprintf("<= %d ms", target.Milliseconds()), Met: boolp(v <= target)}
		}
		rows = append(rows,
			row(fmt.Sprintf("4-step chain, created → complete, p50 of %d", n), percentile(t.chain, 50),
				"4-hop NOTIFY relay p50", relayP50, 10*time.Millisecond),
			row(fmt.Sprintf("4-step chain, created → complete, p99 of %d", n), percentile(t.chain, 99),
				"4-hop NOTIFY relay p99", relayP99, 50*time.Millisecond),
			row(fmt.Sprintf("parent complete → child started, p50 of %d", len(t.handoff)), percentile(t.handoff, 50),
				"1-hop NOTIFY p50", hopP50, 2*time.Millisecond),
		)
	}
	return rows, nil
}
