package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/metrics"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/internal/worker"
	"github.com/stepready/stepready/steps"
)

// claimTimeout bounds one claim statement of the direct dispatcher.
const claimTimeout = time.Minute

// Direct runs claimed steps in this process: one goroutine per attempt, at most Concurrency handlers at once.
//
// A handler's slot is free again as soon as the handler returns, while its outcome waits for the next batch of
// the executor's recorder: claiming the next batch then overlaps with recording the last one, so the database
// works on both at once instead of in turn. At most twice Concurrency attempts are unrecorded at any time (handlers
// running plus outcomes waiting), which bounds what a slow database can pile up.
type Direct struct {
	pool     *pgxpool.Pool
	executor *worker.Executor
	conc     int
	worker   string
	lease    time.Duration
	queues   []string
	metrics  *metrics.Metrics

	work       context.Context
	cancelWork context.CancelCauseFunc
	freed      chan struct{}
	wg         sync.WaitGroup
	mu         sync.Mutex
	running    int // handlers running
	unrecorded int // attempts started whose outcome is not recorded yet (running ones included)
}

// NewDirect returns a direct dispatcher running at most concurrency attempts of exec at once. It claims only steps
// of queues (nil or empty: "default") whose handler exec's registry has (SPEC §21).
func NewDirect(pool *pgxpool.Pool, exec *worker.Executor, concurrency int, queues []string, m *metrics.Metrics) *Direct {
	if len(queues) == 0 {
		queues = []string{"default"}
	}
	work, cancel := context.WithCancelCause(context.Background())
	return &Direct{pool: pool, executor: exec, conc: concurrency, worker: exec.Worker, lease: exec.Lease,
		queues: queues, metrics: m, work: work, cancelWork: cancel, freed: make(chan struct{}, 1)}
}

// Free implements Dispatcher.
func (d *Direct) Free(context.Context) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return max(min(d.conc-d.running, 2*d.conc-d.unrecorded), 0), nil
}

// Freed implements Dispatcher.
func (d *Direct) Freed() <-chan struct{} { return d.freed }

// Dispatch implements Dispatcher: claims and starts in one statement (claim_and_start_steps: the steps go to
// goroutines of this process at once, so there is no queue to wait in between), then runs one goroutine per
// started attempt.
func (d *Direct) Dispatch(ctx context.Context, limit int) (int, store.NextDue, error) {
	begin := time.Now()
	// The claim is not interrupted by a stop that arrives while it runs: a claim cancelled as it commits would
	// leave attempts started with no worker (the reaper would fail them as stalled). Claimed attempts always get
	// their goroutine; a stop then drains them like any other.
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	// next_claim_at is read in the claim's round trip and transaction, before it (see Poller.claimAll). The claim
	// takes only what this process can run: its queues, and the handlers its registry has now.
	claimed, due, err := store.ClaimAndStartStepsNextDue(claimCtx, d.pool, limit, d.worker, d.lease,
		store.Routes{Queues: d.queues, Handlers: d.executor.Registry.Names()})
	if err != nil {
		return 0, store.NextDue{}, err
	}
	d.metrics.Claimed(len(claimed), time.Since(begin))
	d.mu.Lock()
	d.running += len(claimed)
	d.unrecorded += len(claimed)
	d.mu.Unlock()
	d.executor.Reserve(len(claimed))
	for _, c := range claimed {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.executor.RunStarted(d.work, c.ClaimedStep, c.Started, func() {
				d.mu.Lock()
				d.running--
				d.mu.Unlock()
				signal(d.freed)
			}, func() {
				d.mu.Lock()
				d.unrecorded--
				d.mu.Unlock()
				signal(d.freed)
			})
		}()
	}
	return len(claimed), due, nil
}

// Shutdown waits for running attempts until ctx is done, then cancels the rest (they are released uncharged)
// and waits for them to be recorded.
func (d *Direct) Shutdown(ctx context.Context) {
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		d.cancelWork(steps.ErrShutdown)
		<-done
	}
	d.cancelWork(steps.ErrShutdown)
}

// Running returns the number of handlers running now.
func (d *Direct) Running() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.running
}
