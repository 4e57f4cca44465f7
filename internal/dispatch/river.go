package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/stepready/stepready/internal/metrics"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/internal/worker"
	"github.com/stepready/stepready/readiness"
	"github.com/stepready/stepready/steps"
)

// StepJobArgs is the River job of one claimed step (readiness.StepJobArgs, the public face of the job).
type StepJobArgs = readiness.StepJobArgs

// jobClaim is the claim row as its job carries it (ids, no input); storeClaim is the reverse.
func jobClaim(c store.ClaimedStep) readiness.Claim {
	return readiness.Claim{StepID: c.StepID, TaskID: c.TaskID, Name: c.Name, Handler: c.Handler, Attempts: c.Attempts,
		TimeoutMS: c.TimeoutMS, Queue: c.Queue}
}

func storeClaim(c readiness.Claim) store.ClaimedStep {
	return store.ClaimedStep{StepID: c.StepID, TaskID: c.TaskID, Name: c.Name, Handler: c.Handler, Attempts: c.Attempts,
		TimeoutMS: c.TimeoutMS, Queue: c.Queue}
}

// RiverConfig configures the River dispatcher.
type RiverConfig struct {
	// Pool is the database (River's tables live beside the stepready schema). Required.
	Pool *pgxpool.Pool
	// Executor runs the jobs this process works. Required.
	Executor *worker.Executor
	// Concurrency is both this process's River workers per queue and the bound on jobs waiting to be worked.
	Concurrency int
	// Queues are the River queues (steps.queue values) this process claims and works: its claims take steps of
	// these queues only, whose handler Executor's registry has (SPEC §21). Default: ["default"].
	Queues []string
	// PollOnly disables River's LISTEN/NOTIFY. River's producers then find new jobs only by polling: every
	// PollInterval, at most River's FetchPollIntervalDefault (1 s).
	PollOnly bool
	// PollInterval is the client's fallback poll (Config.PollInterval); with PollOnly it is River's fetch poll
	// too, capped at River's default.
	PollInterval time.Duration
	// Logger receives the dispatcher's (and River's) logs.
	Logger *slog.Logger
	// Metrics records claims (nil: none).
	Metrics *metrics.Metrics

	// fetchCooldown overrides River's FetchCooldown (tests only; zero: fetchCooldownDefault).
	fetchCooldown time.Duration
	// claimQueues replaces Queues in the claim only (tests only: a claim of a queue River refuses, which a
	// dispatcher never claims otherwise).
	claimQueues []string
	// skipCheck leaves the claimed rows unchecked before their jobs are inserted (tests only: River then refuses a
	// bad queue itself, and Dispatch's fallback is what fails the step).
	skipCheck bool
}

// fetchCooldownDefault is River's FetchCooldown for the dispatcher's client: the least time between two fetches
// of one queue (River's minimum). A notified producer fetches at once unless it fetched less than this ago, in
// which case it fetches when the cooldown ends: the cooldown is added to a hand-off between steps whose jobs are
// inserted in quick succession, so it is kept as short as River allows.
const fetchCooldownDefault = time.Millisecond

// River dispatches claimed steps as River jobs, inserted with InsertManyTx in the claim's transaction: a claim
// without its job (or the reverse) is never committed. Its River client also works the jobs of its queues,
// whichever daemon inserted them.
type River struct {
	cfg    RiverConfig
	client *river.Client[pgx.Tx]
	freed  chan struct{}
	// cancelRun ends the context the River client runs on (see Start), once Shutdown has stopped it.
	cancelRun context.CancelFunc

	mu      sync.Mutex
	running map[int64]context.CancelCauseFunc // River job id → cancel of the attempt
}

// NewRiver builds the dispatcher and its River client (not started).
func NewRiver(cfg RiverConfig) (*River, error) {
	if len(cfg.Queues) == 0 {
		cfg.Queues = []string{"default"}
	}
	r := &River{cfg: cfg, freed: make(chan struct{}, 1), running: map[int64]context.CancelCauseFunc{}}
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely[StepJobArgs](workers, &riverWorker{r: r}); err != nil {
		return nil, fmt.Errorf("dispatch: river worker: %w", err)
	}
	queues := make(map[string]river.QueueConfig, len(cfg.Queues))
	for _, q := range cfg.Queues {
		queues[q] = river.QueueConfig{MaxWorkers: cfg.Concurrency}
	}
	cooldown := cmp.Or(cfg.fetchCooldown, fetchCooldownDefault)
	client, err := river.NewClient(riverpgxv5.New(cfg.Pool), &river.Config{
		Queues:        queues,
		Workers:       workers,
		Logger:        cfg.Logger,
		JobTimeout:    -1, // the executor enforces each step's own timeout
		MaxAttempts:   1,
		PollOnly:      cfg.PollOnly,
		FetchCooldown: cooldown,
		// River refuses a poll interval shorter than the cooldown (only a test's cooldown is that long).
		FetchPollInterval: max(cooldown, fetchPollInterval(cfg)),
	})
	if err != nil {
		return nil, fmt.Errorf("dispatch: river client: %w", err)
	}
	r.client = client
	return r, nil
}

// fetchPollInterval is how often River's producers look for new jobs without being told. Notified of every
// insert (settleJobs), they need River's default; polling only, each hand-off between steps waits for this
// poll, so it follows the client's poll interval (the latency the user chose), capped at River's default.
func fetchPollInterval(cfg RiverConfig) time.Duration {
	if cfg.PollOnly && cfg.PollInterval > 0 {
		return min(cfg.PollInterval, river.FetchPollIntervalDefault)
	}
	return river.FetchPollIntervalDefault
}

// riverAbortTimeout bounds the wait for River to stop after a start that ctx cancelled.
const riverAbortTimeout = time.Minute

// Start starts the River client (its workers). ctx bounds the start only: cancelling it while Start runs aborts
// the start, cancelling it later changes nothing. River derives every job's context from the context its client
// starts with, and cancelling that context is River's hard stop (StopAndCancel): started with a caller's context
// (the daemon's signal context), the first SIGTERM would cancel every running attempt before Shutdown's grace
// began. So the client runs on a context of its own, and only Shutdown stops it.
func (r *River) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	detach := context.AfterFunc(ctx, cancelRun)
	err := r.client.Start(runCtx)
	if !detach() {
		// ctx ended while River started: the start is aborted (River stops on its cancelled context).
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), riverAbortTimeout)
		defer cancel()
		_ = r.client.StopAndCancel(stopCtx)
		return errors.Join(fmt.Errorf("dispatch: river start aborted: %w", context.Cause(ctx)), err)
	}
	if err != nil {
		cancelRun()
		return err
	}
	r.cancelRun = cancelRun
	return nil
}

// Free implements Dispatcher: concurrency minus the attempts running here and the stepready jobs still waiting
// in this process's queues.
func (r *River) Free(ctx context.Context) (int, error) {
	var waiting int
	err := r.cfg.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job
		WHERE state = 'available' AND kind = $1 AND queue = ANY ($2)`, StepJobArgs{}.Kind(), r.cfg.Queues).Scan(&waiting)
	if err != nil {
		return 0, fmt.Errorf("dispatch: river backlog: %w", err)
	}
	r.mu.Lock()
	running := len(r.running)
	r.mu.Unlock()
	return max(r.cfg.Concurrency-running-waiting, 0), nil
}

// routes are what the dispatcher's claims take: its River client's queues, and the handlers its registry has now.
func (r *River) routes() store.Routes {
	queues := r.cfg.Queues
	if r.cfg.claimQueues != nil {
		queues = r.cfg.claimQueues
	}
	return store.Routes{Queues: queues, Handlers: r.cfg.Executor.Registry.Names()}
}

// Freed implements Dispatcher.
func (r *River) Freed() <-chan struct{} { return r.freed }

// Dispatch implements Dispatcher: next_claim_at, claim and InsertManyTx in one transaction.
//
// One claimed row never stops the others: a row the runtime cannot use (store.ClaimedStep.Check: a queue River
// refuses, a timeout no time.Duration holds) fails its step with class deterministic in the claim's transaction,
// and its job is not inserted. Should River refuse the batch anyway, the claim is rolled back and made again with
// each job inserted on its own under a savepoint (insertEach), where a job River or PostgreSQL refuses for its
// values fails its step alone.
func (r *River) Dispatch(ctx context.Context, limit int) (int, store.NextDue, error) {
	begin := time.Now()
	n, due, err := r.dispatch(ctx, limit, false)
	if _, refused := errors.AsType[*batchInsertError](err); refused {
		r.logger().Warn("dispatch: River refused a batch of jobs; claiming again with one job at a time",
			slog.Any("error", err))
		n, due, err = r.dispatch(ctx, limit, true)
	}
	if err != nil {
		return 0, store.NextDue{}, err
	}
	r.cfg.Metrics.Claimed(n, time.Since(begin))
	return n, due, nil
}

// dispatch is one claim transaction of Dispatch; oneByOne inserts each job under its own savepoint.
func (r *River) dispatch(ctx context.Context, limit int, oneByOne bool) (int, store.NextDue, error) {
	var n int
	var due store.NextDue
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		// Only what this process's River client works: its queues, and the handlers its registry has now.
		claimed, nextDue, err := store.ClaimReadyStepsNextDue(ctx, tx, limit, r.cfg.Executor.Worker,
			r.cfg.Executor.Lease, r.routes())
		if err != nil || len(claimed) == 0 {
			due = nextDue
			return err
		}
		due = nextDue
		n = len(claimed)
		jobs, err := r.failUnusable(ctx, tx, claimed)
		if err != nil || len(jobs) == 0 {
			return err
		}
		now := time.Now()
		params := make([]river.InsertManyParams, len(jobs))
		for i, c := range jobs {
			// The worker reads the step's input (with its context and rules) when it starts the attempt, so
			// the job carries only the claim row's identifiers: nothing large is copied into River's tables.
			params[i] = river.InsertManyParams{Args: StepJobArgs{Step: jobClaim(c), ClaimedAt: now},
				InsertOpts: &river.InsertOpts{MaxAttempts: 1, Queue: c.Queue}}
		}
		var res []*rivertype.JobInsertResult
		if oneByOne {
			jobs, res, err = r.insertEach(ctx, tx, jobs, params)
		} else if res, err = r.client.InsertManyTx(ctx, tx, params); err != nil {
			err = &batchInsertError{err: err}
		}
		if err != nil {
			return err
		}
		return r.settleJobs(ctx, tx, jobs, res)
	})
	if err != nil {
		return 0, store.NextDue{}, err
	}
	return n, due, nil
}

// Shutdown stops River's fetching and lets running attempts finish until ctx is done (River's Stop waits for
// the jobs it fetched); then it cancels the attempts still running (they are released uncharged) and waits for
// River to stop (StopAndCancel).
func (r *River) Shutdown(ctx context.Context) error {
	defer func() {
		if r.cancelRun != nil {
			r.cancelRun()
		}
	}()
	err := r.client.Stop(ctx)
	if err == nil {
		return nil
	}
	r.mu.Lock()
	for _, cancel := range r.running {
		cancel(steps.ErrShutdown)
	}
	r.mu.Unlock()
	hard, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.client.StopAndCancel(hard); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("dispatch: stop river: %w", err)
	}
	return nil
}

type riverWorker struct {
	river.WorkerDefaults[StepJobArgs]
	r *River
}

// Work runs the step. It always returns nil: the outcome is recorded in stepready, never as a River retry.
func (w *riverWorker) Work(ctx context.Context, job *river.Job[StepJobArgs]) error {
	// Any cancellation of River's context (StopAndCancel) is a shutdown for the attempt.
	attemptCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { cancel(steps.ErrShutdown) })
	defer stop()
	w.r.mu.Lock()
	w.r.running[job.ID] = cancel
	w.r.mu.Unlock()
	defer func() {
		w.r.mu.Lock()
		delete(w.r.running, job.ID)
		w.r.mu.Unlock()
		cancel(nil)
		signal(w.r.freed)
	}()
	w.r.cfg.Executor.Run(attemptCtx, storeClaim(job.Args.Step), job.Args.ClaimedAt)
	return nil
}

// settleJobs finishes the insert of the claimed steps' jobs, in one statement of the claim's transaction:
//
//   - It gives the jobs the database's time as scheduled_at where River stamped a later one. River's driver fills
//     scheduled_at from this process's clock, and River only fetches a job once the database's now() reaches it:
//     were this clock ahead of the database's, each step would wait out the difference (an hour of skew, an hour
//     of waiting). Time is the database's (RELIABILITY #7). clock_timestamp() (not now(), the older transaction
//     start) keeps this a no-op on agreeing clocks.
//   - Unless the dispatcher polls only, it announces the jobs of each queue to River's producers, at commit.
//     River's client announces inserts itself, but at most once per FetchCooldown and queue: a job inserted
//     within that window of the previous announcement would wait for a fetch poll (FetchPollInterval, a second by
//     default), and the hand-offs of a chain of steps are a few milliseconds apart. The channel and payload are
//     River's own insert notification, "<schema>.river_insert" on the schema its listener resolves
//     (current_schema(), as River does when no schema is configured) with {"queue": name}, byte for byte, so
//     PostgreSQL folds the two when River sends its own in the same transaction.
//     TestRiverDispatchAnnouncesEveryClaim pins this against the River version of go.mod.
func (r *River) settleJobs(ctx context.Context, tx pgx.Tx, claimed []store.ClaimedStep,
	res []*rivertype.JobInsertResult) error {
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.Job.ID
	}
	var payloads []string
	if !r.cfg.PollOnly {
		for _, c := range claimed {
			p := fmt.Sprintf("{\"queue\": %q}", c.Queue)
			if !slices.Contains(payloads, p) {
				payloads = append(payloads, p)
			}
		}
	}
	if _, err := tx.Exec(ctx, `WITH restamped AS (
			UPDATE river_job SET scheduled_at = now() WHERE id = ANY ($1) AND scheduled_at > clock_timestamp()
			RETURNING 1)
		SELECT pg_notify(current_schema() || '.river_insert', p) FROM unnest($2::text[]) AS p`,
		ids, payloads); err != nil {
		return fmt.Errorf("dispatch: settle river jobs (database time, announcement): %w", err)
	}
	return nil
}
