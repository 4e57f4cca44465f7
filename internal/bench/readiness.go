package bench

import (
	"context"
	"fmt"
	"time"
)

// readinessLatency times step_readiness for one 10-step task while size.ReadinessTasks tasks of 10 steps sit in
// the tables, against the round trip of SELECT 1 on the same connection.
func readinessLatency(ctx context.Context, env *Env, size Size) ([]Row, error) {
	pool, _, err := env.NewDB(ctx, 2)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 't' FROM generate_series(1, %d)`, size.ReadinessTasks),
		`INSERT INTO stepready.steps (task_id, name, handler) SELECT t.id, 's' || g, 'noop'
			FROM stepready.tasks t, generate_series(1, 10) g`,
		// A chain in every task: s1 -> s2 -> ... -> s10.
		`INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
			SELECT p.id, c.id FROM stepready.steps p JOIN stepready.steps c
			  ON c.task_id = p.task_id AND c.name = 's' || (substr(p.name, 2)::int + 1)`,
		`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`, `VACUUM ANALYZE stepready.step_edges`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("fill: %w", err)
		}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var taskID int64
	if err := conn.QueryRow(ctx, `SELECT max(id) / 2 FROM stepready.tasks`).Scan(&taskID); err != nil {
		return nil, err
	}
	// The call and the round trip are timed alternately, so that both see the same state of the machine (an idle
	// virtual machine's wake-up latency alone moves a round trip between 15 and 60 µs from one run to the next).
	run := func(sql string, args ...any) (time.Duration, error) {
		begin := time.Now()
		rows, err := conn.Query(ctx, sql, args...)
		if err != nil {
			return 0, err
		}
		for rows.Next() {
		}
		rows.Close()
		return time.Since(begin), rows.Err()
	}
	var calls, trips []time.Duration
	for i := range 2000 {
		c, err := run(`SELECT * FROM stepready.step_readiness(ARRAY[$1::bigint])`, taskID)
		if err != nil {
			return nil, err
		}
		r, err := run(`SELECT 1`)
		if err != nil {
			return nil, err
		}
		if i >= 200 { // warm-up excluded
			calls, trips = append(calls, c), append(trips, r)
		}
	}
	call, trip := median(calls), median(trips)
	server := max(call-trip, 0)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	return []Row{{Scenario: "1 step_readiness", Figure: fmt.Sprintf("one 10-step task, %d tasks in tables (call − round trip)", size.ReadinessTasks),
		Value: us(server), Unit: "µs", Baseline: "SELECT 1 round trip", BaseVal: us(trip), Ratio: float64(call) / float64(trip),
		Target: "<= 100 µs", Met: boolp(server <= 100*time.Microsecond)}}, nil
}
