package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"

	"github.com/stepready/stepready"
)

// both makes the two sides of a scenario and closes them when it ends.
func both(ctx context.Context, e *env, start bool) (*srSide, *dbSide, func(), error) {
	sr, err := newSR(ctx, e)
	if err != nil {
		return nil, nil, nil, err
	}
	db, err := newDBOS(ctx, e)
	if err != nil {
		sr.close()
		return nil, nil, nil, err
	}
	done := func() { sr.close(); db.close() }
	if start {
		if err := sr.start(ctx); err != nil {
			done()
			return nil, nil, nil, err
		}
		if err := db.start(ctx); err != nil {
			done()
			return nil, nil, nil, err
		}
	}
	return sr, db, done, nil
}

// enqueueScenario: 10 producers create one-step runs for a window, no worker running: stepready.CreateTask (which
// wakes the daemons after its commit) against dbos.Enqueue through a DBOS client.
func enqueueScenario(ctx context.Context, e *env) ([]row, error) {
	sr, db, done, err := both(ctx, e, false)
	if err != nil {
		return nil, err
	}
	defer done()
	rate := func(one func() error) func() (float64, error) {
		return func() (float64, error) {
			n, took, err := produce(ctx, e.size.Window, 0, one)
			return float64(n) / took.Seconds(), err
		}
	}
	got, err := interleave(e.size.Rounds,
		rate(func() error { _, err := sr.create(ctx, oneStepDef); return err }),
		rate(func() error { return db.enqueue("noop") }))
	if err != nil {
		return nil, err
	}
	return []row{measure("enqueue", fmt.Sprintf("%d producers, one-step runs, %s windows, median of %d",
		producers, e.size.Window, e.size.Rounds), "runs/s", true, got[0], got[1], "≥ 2× DBOS", atLeast(2))}, nil
}

// endToEndScenario: the workers run while 10 producers create e.size.EndToEnd one-step runs; the rate is the runs
// over the time from the first creation until the last run finished.
func endToEndScenario(ctx context.Context, e *env) ([]row, error) {
	sr, db, done, err := both(ctx, e, true)
	if err != nil {
		return nil, err
	}
	defer done()
	n := e.size.EndToEnd
	rate := func(one func() error, idle func(context.Context) (bool, error)) func() (float64, error) {
		return func() (float64, error) {
			begin := time.Now()
			if _, _, err := produce(ctx, 0, n, one); err != nil {
				return 0, err
			}
			if err := waitIdle(ctx, idle, 10*time.Minute); err != nil {
				return 0, err
			}
			return float64(n) / time.Since(begin).Seconds(), nil
		}
	}
	got, err := interleave(e.size.Rounds,
		rate(func() error { _, err := sr.create(ctx, oneStepDef); return err }, sr.idle),
		rate(func() error { return db.enqueue("noop") }, db.idle))
	if err != nil {
		return nil, err
	}
	return []row{measure("end to end", fmt.Sprintf("%d producers create %d one-step runs while the workers run, median of %d",
		producers, n, e.size.Rounds), "runs/s", true, got[0], got[1], "≥ 1× DBOS", atLeast(1))}, nil
}

// srWait polls every millisecond until task id is complete and returns the Go clock's instant it saw it.
func (s *srSide) wait(ctx context.Context, id int64, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		var status string
		if err := s.pool.QueryRow(ctx, `SELECT status FROM stepready.tasks WHERE id = $1`, id).Scan(&status); err != nil {
			return time.Time{}, err
		}
		switch status {
		case "complete":
			return time.Now(), nil
		case "error", "cancelled":
			return time.Time{}, fmt.Errorf("task %d ended %s", id, status)
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("task %d not complete after %s", id, limit)
		}
		time.Sleep(time.Millisecond)
	}
}

// oneAtATime times count runs of each side, alternating, and returns the latencies.
func oneAtATime(count int, sr, db func() (time.Duration, error)) ([]time.Duration, []time.Duration, error) {
	var a, b []time.Duration
	for range count {
		x, err := sr()
		if err != nil {
			return nil, nil, err
		}
		y, err := db()
		if err != nil {
			return nil, nil, err
		}
		a, b = append(a, x), append(b, y)
	}
	return a, b, nil
}

// chainScenario: a 4-step chain of no-op steps, one at a time: stepready.CreateTask until the task is seen
// complete (polled every millisecond), against dbos.RunWorkflow of a 4-step workflow until GetResult returns.
func chainScenario(ctx context.Context, e *env) ([]row, error) {
	sr, db, done, err := both(ctx, e, true)
	if err != nil {
		return nil, err
	}
	defer done()
	a, b, err := oneAtATime(e.size.Chains, func() (time.Duration, error) {
		begin := time.Now()
		id, err := sr.create(ctx, chainDef)
		if err != nil {
			return 0, err
		}
		end, err := sr.wait(ctx, id, time.Minute)
		return end.Sub(begin), err
	}, func() (time.Duration, error) {
		begin := time.Now()
		h, err := dbos.RunWorkflow(db.dctx, dbChain, "")
		if err != nil {
			return 0, err
		}
		_, err = h.GetResult()
		return time.Since(begin), err
	})
	if err != nil {
		return nil, err
	}
	return []row{measure("chain", fmt.Sprintf("4-step chain p50, one at a time, %d each", e.size.Chains), "ms", false,
		durationsMS(a), durationsMS(b), "≤ DBOS (ratio ≥ 1)", atLeast(1))}, nil
}

// signalScenario: a run waits for a signal, then runs one step. Timed: the call that sends it (stepready.SendSignal,
// dbos.Send), and from the call's start until the next step's body starts.
func signalScenario(ctx context.Context, e *env) ([]row, error) {
	sr, db, done, err := both(ctx, e, true)
	if err != nil {
		return nil, err
	}
	defer done()
	drain := func() {
		for {
			select {
			case <-marks:
			default:
				return
			}
		}
	}
	awaitMark := func(begin time.Time) (time.Duration, error) {
		select {
		case m := <-marks:
			return m.Sub(begin), nil
		case <-time.After(30 * time.Second):
			return 0, errors.New("the step after the signal did not start within 30 s")
		}
	}
	var srCall, dbCall, srNext, dbNext []time.Duration
	for range e.size.Signals {
		// stepready: wait until the wait step waits, then send.
		id, err := sr.create(ctx, signalDef)
		if err != nil {
			return nil, err
		}
		for {
			var state string
			if err := sr.pool.QueryRow(ctx, `SELECT state FROM stepready.steps WHERE task_id = $1 AND name = 'w'`,
				id).Scan(&state); err != nil {
				return nil, err
			}
			if state == "waiting" {
				break
			}
			time.Sleep(time.Millisecond)
		}
		drain()
		begin := time.Now()
		if _, err := stepready.SendSignal(ctx, sr.pool, id, "go", json.RawMessage(`"x"`), stepready.SignalOptions{}); err != nil {
			return nil, err
		}
		srCall = append(srCall, time.Since(begin))
		d, err := awaitMark(begin)
		if err != nil {
			return nil, fmt.Errorf("stepready: %w", err)
		}
		srNext = append(srNext, d)

		// DBOS: start the workflow; its Recv waits (a short pause lets it get there), then send.
		h, err := dbos.RunWorkflow(db.dctx, dbSignal, "")
		if err != nil {
			return nil, err
		}
		time.Sleep(20 * time.Millisecond)
		drain()
		begin = time.Now()
		if err := dbos.Send(db.dctx, h.GetWorkflowID(), "x", "go"); err != nil {
			return nil, err
		}
		dbCall = append(dbCall, time.Since(begin))
		d, err = awaitMark(begin)
		if err != nil {
			return nil, fmt.Errorf("dbos: %w", err)
		}
		dbNext = append(dbNext, d)
		if _, err := h.GetResult(); err != nil {
			return nil, err
		}
	}
	return []row{
		measure("signal", fmt.Sprintf("send call p50 (SendSignal / Send), %d each", e.size.Signals), "ms", false,
			durationsMS(srCall), durationsMS(dbCall), "≤ DBOS (ratio ≥ 1)", atLeast(1)),
		measure("signal", fmt.Sprintf("send → next step started p50, %d each", e.size.Signals), "ms", false,
			durationsMS(srNext), durationsMS(dbNext), "≤ DBOS (ratio ≥ 1)", atLeast(1)),
	}, nil
}

// drainScenario loads n runs of each side with no worker running, then starts the workers and times them until
// every run finished; once per round, interleaved.
func drainScenario(ctx context.Context, e *env, n int, def json.RawMessage, dbName string) ([]float64, []float64, error) {
	sr, db, done, err := both(ctx, e, false)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	got, err := interleave(e.size.Rounds, func() (float64, error) {
		defs := make([]json.RawMessage, n)
		for i := range defs {
			defs[i] = def
		}
		if _, err := stepready.CreateTasks(ctx, sr.pool, defs); err != nil {
			return 0, err
		}
		begin := time.Now()
		if err := sr.start(ctx); err != nil {
			return 0, err
		}
		defer sr.stop()
		if err := waitIdle(ctx, sr.idle, 20*time.Minute); err != nil {
			return 0, err
		}
		return float64(n) / time.Since(begin).Seconds(), nil
	}, func() (float64, error) {
		if _, _, err := produce(ctx, 0, n, func() error { return db.enqueue(dbName) }); err != nil {
			return 0, err
		}
		begin := time.Now()
		if err := db.start(ctx); err != nil {
			return 0, err
		}
		defer db.stop()
		if err := waitIdle(ctx, db.idle, 5*time.Minute); err != nil {
			return 0, fmt.Errorf("dbos (%s): %w", db.statuses(ctx), err)
		}
		return float64(n) / time.Since(begin).Seconds(), nil
	})
	if err != nil {
		return nil, nil, err
	}
	return got[0], got[1], nil
}

// backlogScenario: e.size.Backlog one-step runs queued, then drained.
func backlogScenario(ctx context.Context, e *env) ([]row, error) {
	a, b, err := drainScenario(ctx, e, e.size.Backlog, oneStepDef, "noop")
	if err != nil {
		return nil, err
	}
	return []row{measure("backlog", fmt.Sprintf("drain %d queued one-step runs, median of %d", e.size.Backlog,
		e.size.Rounds), "runs/s", true, a, b, "", nil)}, nil
}

// inFlightScenario: e.size.InFlight 4-step chains queued, then run to the end.
func inFlightScenario(ctx context.Context, e *env) ([]row, error) {
	a, b, err := drainScenario(ctx, e, e.size.InFlight, chainDef, "chain")
	if err != nil {
		return nil, err
	}
	return []row{measure("in flight", fmt.Sprintf("%d 4-step chains in flight, median of %d", e.size.InFlight,
		e.size.Rounds), "chains/s", true, a, b, "", nil)}, nil
}

// fanOutScenario: one run fans out to 100 no-op steps (DBOS: 100 child workflows on a queue) and joins them; one
// at a time.
func fanOutScenario(ctx context.Context, e *env) ([]row, error) {
	sr, db, done, err := both(ctx, e, true)
	if err != nil {
		return nil, err
	}
	defer done()
	a, b, err := oneAtATime(e.size.FanOuts, func() (time.Duration, error) {
		begin := time.Now()
		id, err := sr.create(ctx, fanOutDef)
		if err != nil {
			return 0, err
		}
		end, err := sr.wait(ctx, id, 5*time.Minute)
		return end.Sub(begin), err
	}, func() (time.Duration, error) {
		begin := time.Now()
		h, err := dbos.RunWorkflow(db.dctx, dbFanOut, "")
		if err != nil {
			return 0, err
		}
		_, err = h.GetResult()
		return time.Since(begin), err
	})
	if err != nil {
		return nil, err
	}
	return []row{measure("fan-out", fmt.Sprintf("fan-out of 100 + join, per run, p50 of %d", e.size.FanOuts), "ms",
		false, durationsMS(a), durationsMS(b), "", nil)}, nil
}
