package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/steps"
)

// waitingDefinition is the task scenario 11 keeps waiting: one step that waits a day for the signal "go", then a
// no-op step that receives its payload.
var waitingDefinition = json.RawMessage(`{"name": "waiting", "steps": [
	{"name": "approve", "wait": {"signal": "go", "timeout_ms": 86400000}},
	{"name": "after", "handler": "noop", "depends_on": ["approve"], "input": {"by": "${deps.approve.by}"}}]}`)

// signalClients is how many connections send signals (and create tasks, the baseline) at once in scenario 11c.
const signalClients = 4

// signalRun is how long each series of scenario 11c runs.
const signalRun = 10 * time.Second

// loadWaiting creates n tasks of waitingDefinition (create_tasks, 1000 per call) and returns when each one's first
// step is waiting.
func loadWaiting(ctx context.Context, pool *pgxpool.Pool, n int) error {
	for done := 0; done < n; {
		batch := min(creationLoadBatch, n-done)
		defs := make([]json.RawMessage, batch)
		for i := range defs {
			defs[i] = waitingDefinition
		}
		b, err := json.Marshal(defs)
		if err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, `SELECT count(*) FROM stepready.create_tasks($1::jsonb)`, string(b)); err != nil {
			return fmt.Errorf("load waiting tasks: %w", err)
		}
		done += batch
	}
	var waiting int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps WHERE state = 'waiting'`).Scan(&waiting); err != nil {
		return err
	}
	if waiting != n {
		return fmt.Errorf("%d steps waiting after loading %d waiting tasks", waiting, n)
	}
	_, err := pool.Exec(ctx, `VACUUM ANALYZE stepready.steps, stepready.tasks, stepready.step_edges`)
	return err
}

// signals is scenario 11, waiting for the world (SPEC §20):
//
//   - 11a: the peak resident set of the real daemon working scenario 6's workload with size.SignalWaiting tasks
//     waiting for a signal, against the same with none waiting (a waiting step holds no goroutine, connection or
//     timer of the daemon: target ≤ 1.1×);
//   - 11b: scenario 1's claim (100 of size.ClaimReady ready among size.ClaimSmall steps) with size.SignalWaiting
//     tasks waiting besides, against none waiting (waiting steps are outside the claim index: target ≤ 1.2×);
//   - 11c: signal sent → dependent step started, p50 with direct dispatch, both ends on the database's clock
//     (signals.created_at, the dependent's last_attempted_at), against scenario 3's one-hop NOTIFY (target
//     ≤ 2 ms); and send_signal's throughput from 4 clients delivering to waiting steps, against create_task's of
//     the same task from 4 clients (reported, no target).
func signals(ctx context.Context, env *Env, size Size) ([]Row, error) {
	n := size.SignalWaiting
	var rows []Row

	bin, _, remove, err := buildScheduler(ctx)
	if err != nil {
		return nil, err
	}
	defer remove()
	// Peak RSS varies by a few MB from one run to the next (the Go heap's growth): medians of three, interleaved.
	// The RSS after the probe task (before the workload) is kept too: it tells a daemon that holds more from the
	// start from one whose work peaks higher.
	var idle [2][]float64
	run := func(i int, preload func(*pgxpool.Pool) error) func() (float64, error) {
		return func() (float64, error) {
			m, err := measureDaemon(ctx, env, bin, size.MemorySteps, preload)
			if err != nil {
				return 0, err
			}
			idle[i] = append(idle[i], float64(m.idle))
			return float64(m.peak), nil
		}
	}
	peaks, err := medians(run(0, nil), run(1, func(pool *pgxpool.Pool) error { return loadWaiting(ctx, pool, n) }))
	if err != nil {
		return nil, fmt.Errorf("daemon memory: %w", err)
	}
	none, many := int64(peaks[0]), int64(peaks[1])
	idleNone, idleMany := medianFloat(idle[0]), medianFloat(idle[1])
	ratio := float64(many) / float64(none)
	rows = append(rows, Row{Scenario: "11a signals: daemon memory",
		Figure: fmt.Sprintf("peak RSS of `scheduler run`, %d no-op steps, %d tasks waiting for a signal, median of %d%s",
			size.MemorySteps, n, repeatRuns, env.Options.label()),
		Value: megabytes(many), Unit: "MB", Baseline: "none waiting", BaseVal: megabytes(none),
		Ratio: ratio, Target: "ratio <= 1.1", Met: boolp(ratio <= 1.1)},
		Row{Scenario: "11a signals: daemon memory",
			Figure: fmt.Sprintf("RSS of `scheduler run` after its first step, %d tasks waiting, median of %d%s", n,
				repeatRuns, env.Options.label()),
			Value: megabytes(int64(idleMany)), Unit: "MB", Baseline: "none waiting", BaseVal: megabytes(int64(idleNone)),
			Ratio: idleMany / idleNone, Target: "reported"})

	claimNone, claimMany, err := signalClaim(ctx, env, size, n)
	if err != nil {
		return nil, err
	}
	ratio = float64(claimMany) / float64(claimNone)
	rows = append(rows, Row{Scenario: "11b signals: claim cost",
		Figure: fmt.Sprintf("claim 100 of %d ready among %d steps, %d tasks waiting%s", size.ClaimReady,
			size.ClaimSmall, n, env.Options.label()),
		Value: millis(claimMany), Unit: "ms", Baseline: "none waiting", BaseVal: millis(claimNone),
		Ratio: ratio, Target: "ratio <= 1.2", Met: boolp(ratio <= 1.2)})

	hops, _, err := notifyRelay(ctx, env, size.LatencyTasks)
	if err != nil {
		return nil, err
	}
	hopP50 := percentile(hops, 50)
	lib, raw, calls, err := signalLatency(ctx, env, size.LatencyTasks)
	if err != nil {
		return nil, fmt.Errorf("signal latency: %w", err)
	}
	// For comparison, scenario 3's own hand-off in this run and on this load: a completion → its child started.
	chain, err := chainLatency(ctx, env, size.LatencyTasks, stepready.DispatchDirect)
	if err != nil {
		return nil, fmt.Errorf("chain latency: %w", err)
	}
	latencyRow := func(figure string, v time.Duration, target bool) Row {
		r := Row{Scenario: "11c signals: latency", Figure: "(a) direct dispatch" + env.Options.label() + ", " + figure,
			Value: millis(v), Unit: "ms", Baseline: "1-hop NOTIFY p50", BaseVal: millis(hopP50),
			Ratio: float64(v) / float64(hopP50), Target: "reported"}
		if target {
			r.Target, r.Met = "<= 2 ms", boolp(v <= 2*time.Millisecond)
		}
		return r
	}
	rows = append(rows,
		latencyRow(fmt.Sprintf("stepready.SendSignal → dependent started, p50 of %d", len(lib)), percentile(lib, 50), true),
		latencyRow(fmt.Sprintf("stepready.SendSignal → dependent started, p99 of %d", len(lib)), percentile(lib, 99), false),
		latencyRow(fmt.Sprintf("autocommit send_signal → dependent started, p50 of %d", len(raw)), percentile(raw, 50), true),
		latencyRow(fmt.Sprintf("scenario 3's parent complete → child started, p50 of %d (same run)", len(chain.handoff)),
			percentile(chain.handoff, 50), false),
		latencyRow(fmt.Sprintf("the SendSignal call alone (Go clock, with its commit), p50 of %d", len(calls[0])),
			percentile(calls[0], 50), false),
		latencyRow(fmt.Sprintf("the autocommit send_signal alone (Go clock), p50 of %d", len(calls[1])),
			percentile(calls[1], 50), false))

	sends, creates, err := signalThroughput(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("signal throughput: %w", err)
	}
	rows = append(rows, Row{Scenario: "11c signals: throughput",
		Figure: fmt.Sprintf("send_signal to waiting steps, %d clients%s", signalClients, env.Options.label()),
		Value:  sends, Unit: "signals/s", Baseline: fmt.Sprintf("create_task of the task, %d clients, %s", signalClients, signalRun),
		BaseVal: creates, Ratio: sends / creates, Target: "reported"})
	return rows, nil
}

// signalClaimRounds is how many times scenario 11b times claims on each of its two databases, alternately; each
// time is the median of signalClaimEach claims.
const (
	signalClaimRounds = 15
	signalClaimEach   = 3
)

// signalClaim is scenario 11b: two databases filled as scenario 1's small one (size.ClaimReady ready among
// size.ClaimSmall steps), the second with n waiting tasks besides, both alive at once; claims are timed on one
// then the other, signalClaimRounds times, so that the machine's load weighs on both alike (timed one database
// after the other, a busy minute on a shared machine made the ratio 2.6 where interleaved it is 1.0). It returns
// the medians with none and with n waiting.
func signalClaim(ctx context.Context, env *Env, size Size, n int) (none, many time.Duration, err error) {
	a, _, err := env.NewDB(ctx, 4)
	if err != nil {
		return 0, 0, err
	}
	defer a.Close()
	kept := env.n
	env.keepPrevious = true
	b, _, err := env.NewDB(ctx, 4)
	env.keepPrevious = false
	if err != nil {
		return 0, 0, err
	}
	defer b.Close()
	defer func() {
		a.Close()
		if dropErr := env.dropDB(context.WithoutCancel(ctx), kept); err == nil {
			err = dropErr
		}
	}()
	for _, pool := range []*pgxpool.Pool{a, b} {
		if err := fill(ctx, pool, size.ClaimSmall, size.ClaimReady); err != nil {
			return 0, 0, err
		}
	}
	if err := loadWaiting(ctx, b, n); err != nil {
		return 0, 0, err
	}
	// The same vacuum and analyze for both, after the load.
	if _, err := a.Exec(ctx, `VACUUM ANALYZE stepready.steps, stepready.tasks, stepready.step_edges`); err != nil {
		return 0, 0, err
	}
	var da, db []time.Duration
	for range signalClaimRounds {
		x, err := timeClaim(ctx, a, signalClaimEach)
		if err != nil {
			return 0, 0, err
		}
		y, err := timeClaim(ctx, b, signalClaimEach)
		if err != nil {
			return 0, 0, err
		}
		da, db = append(da, x), append(db, y)
	}
	return median(da), median(db), nil
}

// signalLatency creates 2n tasks of waitingDefinition one at a time under a Client with direct dispatch (poll
// interval latencyPollInterval, so only a notification starts the dependent in time), waits until each one's
// first step waits, sends its signal, and waits until the task is complete. The signal goes alternately through
// stepready.SendSignal (its transaction: BEGIN, the actor's set_config, send_signal, COMMIT) and through one
// autocommit `SELECT send_signal(…)`. It returns, for each way, per task, the signal's created_at (the now() of
// the sending transaction) → the dependent step's last_attempted_at; and the durations of the calls themselves on
// the Go clock (calls[0]: SendSignal, calls[1]: the autocommit statement), each with its commit.
func signalLatency(ctx context.Context, env *Env, n int) (library, autocommit []time.Duration, calls [][]time.Duration,
	err error) {
	pool, url, err := env.NewDB(ctx, 20)
	if err != nil {
		return nil, nil, nil, err
	}
	defer pool.Close()
	// The sender has a connection of its own, kept warm like a webhook server's: on the client's pool of 20 a send
	// often landed on a connection that had never planned send_signal's statements, which cost milliseconds.
	senderCfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, nil, err
	}
	senderCfg.MaxConns = 1
	if env.bouncer != nil {
		store.UsePoolerQueryMode(senderCfg.ConnConfig)
	}
	sender, err := pgxpool.NewWithConfig(ctx, senderCfg)
	if err != nil {
		return nil, nil, nil, err
	}
	defer sender.Close()
	last := make(chan int64, 1)
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
		select {
		case last <- s.TaskID:
		default:
		}
		return nil, nil
	}))
	poll := latencyPollInterval
	if env.Options.PollOnly {
		poll = latencyPollOnlyInterval
	}
	c, err := stepready.NewClient(pool, stepready.Config{Registry: reg, Dispatch: stepready.DispatchDirect,
		Concurrency: 10, PollInterval: poll, PollOnly: env.Options.PollOnly,
		Logger: env.Logger.With("component", "client")})
	if err != nil {
		return nil, nil, nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, nil, nil, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = c.Stop(stopCtx)
	}()
	var ids []int64
	calls = make([][]time.Duration, 2)
	for i := range latencyWarmup + 2*n {
		id, err := stepready.CreateTask(ctx, pool, waitingDefinition)
		if err != nil {
			return nil, nil, nil, err
		}
		if err := waitStepState(ctx, pool, id, "approve", "waiting"); err != nil {
			return nil, nil, nil, err
		}
		begin := time.Now()
		if i%2 == 0 {
			_, err = stepready.SendSignal(ctx, sender, id, "go", json.RawMessage(`{"by": "bench"}`),
				stepready.SignalOptions{})
		} else {
			_, err = sender.Exec(ctx, `SELECT stepready.send_signal($1, 'go', '{"by": "bench"}')`, id)
		}
		if err != nil {
			return nil, nil, nil, err
		}
		if i >= latencyWarmup {
			calls[i%2] = append(calls[i%2], time.Since(begin))
		}
		if err := waitChain(ctx, pool, id, last); err != nil {
			return nil, nil, nil, err
		}
		if i >= latencyWarmup {
			ids = append(ids, id)
		}
	}
	// The tasks signalled through the library and those signalled by one autocommit statement, alternately.
	var lib, raw []int64
	for i, id := range ids {
		if (latencyWarmup+i)%2 == 0 {
			lib = append(lib, id)
		} else {
			raw = append(raw, id)
		}
	}
	var bad int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps
		WHERE task_id = ANY($1) AND name = 'after' AND (state <> 'complete' OR attempts <> 1)`,
		ids).Scan(&bad); err != nil {
		return nil, nil, nil, err
	}
	if bad > 0 {
		return nil, nil, nil, fmt.Errorf("%d dependent steps did not complete at their first attempt", bad)
	}
	const q = `SELECT (extract(epoch FROM d.last_attempted_at - s.created_at) * 1e6)::bigint
		FROM stepready.signals s JOIN stepready.steps d ON d.task_id = s.task_id AND d.name = 'after'
		WHERE s.task_id = ANY($1)`
	if library, err = durations(ctx, pool, q, lib); err != nil {
		return nil, nil, nil, err
	}
	autocommit, err = durations(ctx, pool, q, raw)
	return library, autocommit, calls, err
}

// medianFloat is the median of vs (0 for none).
func medianFloat(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// waitStepState polls every millisecond until step name of task id is in state want (for at most
// latencyTaskLimit).
func waitStepState(ctx context.Context, pool *pgxpool.Pool, id int64, name, want string) error {
	limit := time.Now().Add(latencyTaskLimit)
	for {
		var state string
		if err := pool.QueryRow(ctx, `SELECT state FROM stepready.steps WHERE task_id = $1 AND name = $2`, id, name).
			Scan(&state); err != nil {
			return fmt.Errorf("task %d step %s: %w", id, name, err)
		}
		if state == want {
			return nil
		}
		if time.Now().After(limit) {
			return fmt.Errorf("task %d step %s is %s, not %s, after %s", id, name, state, want, latencyTaskLimit)
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// signalThroughput measures create_task of waitingDefinition from signalClients connections for signalRun, then
// send_signal from as many connections to every task it created, each signal completing a waiting step (no
// daemon runs, so the dependents stay ready). It returns both rates per second.
func signalThroughput(ctx context.Context, env *Env) (sends, creates float64, err error) {
	pool, _, err := env.NewDB(ctx, signalClients+1)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	creates, err = ratePerClient(ctx, pool, signalClients, signalRun, func(ctx context.Context, c *pgxpool.Conn) (int, error) {
		_, err := c.Exec(ctx, `SELECT stepready.create_task($1::jsonb)`, string(waitingDefinition))
		return 1, err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("create_task: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT task_id FROM stepready.steps WHERE state = 'waiting' ORDER BY task_id`)
	if err != nil {
		return 0, 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, 0, err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE stepready.steps, stepready.tasks, stepready.step_edges`); err != nil {
		return 0, 0, err
	}
	// The tasks the baseline created are the ones signalled, one signal each, in id order across the clients,
	// until every one has had its signal (as many sends as creations: the two rates are over the same work).
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, signalClients)
	begin := time.Now()
	for range signalClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
				for i := next.Add(1) - 1; i < int64(len(ids)); i = next.Add(1) - 1 {
					if _, err := c.Exec(ctx, `SELECT stepready.send_signal($1, 'go', '{"by": "bench"}')`, ids[i]); err != nil {
						return err
					}
				}
				return nil
			})
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	close(errs)
	for err := range errs {
		if err != nil {
			return 0, 0, fmt.Errorf("send_signal: %w", err)
		}
	}
	sends = float64(len(ids)) / elapsed.Seconds()
	return sends, creates, nil
}
