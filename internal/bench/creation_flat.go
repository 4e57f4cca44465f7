package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stepready/stepready"
)

// creationFlatProducers is how many goroutines create tasks at once in scenario 7d (issue 34: "10 concurrent
// producers").
const creationFlatProducers = 10

// creationFlat is scenario 7d: creationFlatProducers goroutines call stepready.CreateTask of a one-step task
// (the library, as applications call it: it wakes the daemons after each commit, folded) for size.CreationFlatRun
// with no daemon running, on a database whose autovacuum runs as the server's settings say. The tasks created in
// the last window (a minute at full size, a tenth of the run when it is shorter) over those of the first: the rate
// must not fall as the tables grow (issue 34: ≥ 0.9 over 10 minutes on the durable profile).
func creationFlat(ctx context.Context, env *Env, size Size) ([]Row, error) {
	pool, _, err := env.NewDB(ctx, creationFlatProducers+2)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	run := size.CreationFlatRun
	window := min(time.Minute, run/10)
	def := json.RawMessage(`{"name": "flat", "steps": [{"name": "a", "handler": "noop"}]}`)
	var first, last, total atomic.Int64
	var firstErr error
	var once sync.Once
	begin := time.Now()
	var wg sync.WaitGroup
	for range creationFlatProducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := stepready.CreateTask(ctx, pool, def); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				at := time.Since(begin)
				switch {
				case at >= run:
					return
				case at < window:
					first.Add(1)
				case at >= run-window:
					last.Add(1)
				}
				total.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	rate := float64(total.Load()) / run.Seconds()
	ratio := float64(last.Load()) / float64(max(first.Load(), 1))
	label := env.Options.label()
	return []Row{
		{Scenario: "7d creation over time", Figure: fmt.Sprintf("stepready.CreateTask of a one-step task, %d producers, "+
			"%s: rate%s", creationFlatProducers, run, label), Value: rate, Unit: "tasks/s", Target: "(reported)"},
		{Scenario: "7d creation over time", Figure: fmt.Sprintf("tasks created in the last %s over the first %s of %s%s",
			window, window, run, label), Value: ratio, Unit: "×", Target: ">= 0.9", Met: boolp(ratio >= 0.9)},
	}, nil
}
