package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// wakeupTasks is how many one-step tasks scenario 3c creates per way of creating them.
const wakeupTasks = 60

// wakeups is scenario 3c, how soon a new task starts when nothing but a wake-up tells the daemon (issue 34: no
// writing transaction NOTIFYs; docs/design-core.md "Wake-ups"). A direct-dispatch Client (concurrency 10, poll
// interval 10 s, the default probe interval) runs one-step no-op tasks created one at a time, each once the one
// before it has started, alternately: (a) by plain SQL (`SELECT stepready.create_task(…)` in autocommit: the
// probe of the wake-up counter finds it), and (b) through stepready.CreateTask (its NOTIFY after the commit wakes
// the listener). Reported: p50 and p99 of tasks.created_at → the step's last_attempted_at (both the database's
// clock; created_at is the creating transaction's start, so the commit is inside the figure).
func wakeups(ctx context.Context, env *Env, _ Size) ([]Row, error) {
	pool, _, err := env.NewDB(ctx, 20)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) { return nil, nil }))
	c, err := stepready.NewClient(pool, stepready.Config{Registry: reg, Dispatch: stepready.DispatchDirect,
		Concurrency: 10, PollInterval: latencyPollInterval, PollOnly: env.Options.PollOnly,
		Logger: env.Logger.With("component", "client")})
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = c.Stop(stopCtx)
	}()
	def := json.RawMessage(`{"name": "wake", "steps": [{"name": "a", "handler": "noop"}]}`)
	var plain, lib []time.Duration
	for i := range 2 * (wakeupTasks + latencyWarmup) {
		var id int64
		if i%2 == 0 {
			err = pool.QueryRow(ctx, `SELECT stepready.create_task($1)`, def).Scan(&id)
		} else {
			id, err = stepready.CreateTask(ctx, pool, def)
		}
		if err != nil {
			return nil, err
		}
		var took time.Duration
		deadline := time.Now().Add(latencyTaskLimit)
		for {
			var d *time.Duration
			if err := pool.QueryRow(ctx, `SELECT s.last_attempted_at - t.created_at FROM stepready.steps s
				JOIN stepready.tasks t ON t.id = s.task_id WHERE s.task_id = $1`, id).Scan(&d); err != nil {
				return nil, err
			}
			if d != nil {
				took = *d
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("task %d did not start within %s", id, latencyTaskLimit)
			}
			time.Sleep(time.Millisecond)
		}
		if i < 2*latencyWarmup {
			continue
		}
		if i%2 == 0 {
			plain = append(plain, took)
		} else {
			lib = append(lib, took)
		}
	}
	label := env.Options.label()
	row := func(figure string, d time.Duration, base time.Duration, target string, met *bool) Row {
		return Row{Scenario: "3c wake-ups", Figure: figure + label, Value: millis(d), Unit: "ms",
			Baseline: "stepready.CreateTask (NOTIFY after commit)", BaseVal: millis(base),
			Ratio: float64(d) / float64(max(base, 1)), Target: target, Met: met}
	}
	p50, p99 := percentile(plain, 50), percentile(plain, 99)
	return []Row{
		row(fmt.Sprintf("plain-SQL create_task → started, p50 of %d (the probe, %s)", len(plain),
			stepready.ProbeIntervalDefault), p50, percentile(lib, 50),
			"<= probe interval + 10 ms", boolp(p50 <= stepready.ProbeIntervalDefault+10*time.Millisecond)),
		row(fmt.Sprintf("plain-SQL create_task → started, p99 of %d", len(plain)), p99, percentile(lib, 99),
			"(reported)", nil),
	}, nil
}
