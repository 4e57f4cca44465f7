package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/demo"
	"github.com/stepready/stepready/internal/readmodel"
)

// demoSignalDelay is how long a demo task's step waits for its signal before the demo sends it (SPEC §20): long
// enough to see it waiting on the console, short enough that `make run` ends in a few seconds.
const demoSignalDelay = 3 * time.Second

// demoSignalPoll is how often the demo looks for steps of its tasks waiting for a signal.
const demoSignalPoll = 250 * time.Millisecond

// demoSignals plays the person or the webhook the demo's wait steps wait for: every step of tasks that waits for
// a signal gets it demoSignalDelay after the demo first saw it waiting, through stepready.SendSignal (actor
// "demo"; idempotency key demo:STEP_ID, so a repeat adds nothing), with a payload naming the sender, as
// `scheduler signal send TASK_ID NAME --payload '{"by": "scheduler demo", …}'` would. It runs until ctx ends.
func demoSignals(ctx context.Context, pool *pgxpool.Pool, tasks []demo.Task, logger *slog.Logger) {
	ids := make([]int64, len(tasks))
	for i, t := range tasks {
		ids[i] = t.ID
	}
	seen := map[int64]time.Time{} // step id → when the demo first saw it waiting
	sent := map[int64]bool{}
	tick := time.NewTicker(demoSignalPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		waiting, err := readmodel.WaitingForSignal(ctx, pool, ids)
		if err != nil {
			if ctx.Err() == nil {
				logger.Warn("scheduler: demo: read the waiting steps", slog.Any("error", err))
			}
			continue
		}
		now := time.Now()
		for _, w := range waiting {
			first, ok := seen[w.StepID]
			if !ok {
				seen[w.StepID] = now
				continue
			}
			if sent[w.StepID] || now.Sub(first) < demoSignalDelay {
				continue
			}
			payload, _ := json.Marshal(map[string]string{"by": "scheduler demo",
				"note": fmt.Sprintf("sent %s after %s started waiting", demoSignalDelay, w.Name)})
			_, err := stepready.SendSignal(ctx, pool, w.TaskID, w.Signal, payload, stepready.SignalOptions{
				Actor: "demo", IdempotencyKey: fmt.Sprintf("demo:%d", w.StepID)})
			if err != nil {
				if ctx.Err() == nil {
					logger.Warn("scheduler: demo: send a signal", slog.Int64("task", w.TaskID),
						slog.String("signal", w.Signal), slog.Any("error", err))
				}
				continue
			}
			sent[w.StepID] = true
		}
	}
}
