package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/store"
)

// BatchMaxDefault is the largest batch a BatchRecorder or BatchStarter sends in one flush when none is set.
const BatchMaxDefault = 1000

// batchFlushTimeout bounds one flush, retries of a lost connection included (as recordTimeout bounds one outcome).
const batchFlushTimeout = time.Minute

// batchResult is what a flush gives one request.
type batchResult[Res any] struct {
	res Res
	err error
}

type batchItem[Req, Res any] struct {
	req Req
	out chan batchResult[Res] // buffered (1): the flusher never blocks on a caller; nil when done is set
	// done, when set, receives the result in the flusher's goroutine instead of out (submit): it must be quick.
	done func(Res, error)
}

// batcher runs the requests of many goroutines together. One flusher goroutine takes the first waiting request,
// then every other request already waiting (up to max), and runs them all with one call. Nothing waits on
// purpose: under light load each request is flushed alone at once (no added latency); under load, the requests
// that arrive while a flush runs go together in the next one, so the batch size follows the load.
type batcher[Req, Res any] struct {
	max   int
	flush func(ctx context.Context, reqs []Req) []batchResult[Res] // one result per request, in order
	in    chan batchItem[Req, Res]

	// expected, when set, is how many requests may arrive soon (the callers that are on their way): a batch
	// smaller than that waits for more while they keep coming, at most gap after the last one and linger in all.
	// Unset: no waiting.
	expected func() int
	gap      time.Duration
	linger   time.Duration

	mu      sync.RWMutex // held for reading while sending to in, for writing to close it
	stopped bool
	done    chan struct{}
}

func newBatcher[Req, Res any](maxBatch int, flush func(context.Context, []Req) []batchResult[Res]) *batcher[Req, Res] {
	if maxBatch <= 0 {
		maxBatch = BatchMaxDefault
	}
	b := &batcher[Req, Res]{max: maxBatch, flush: flush, in: make(chan batchItem[Req, Res], maxBatch),
		done: make(chan struct{})}
	go b.run()
	return b
}

// do runs req in the next batch and waits for its result. ok is false when the batcher is stopped: the caller
// then does the work itself.
func (b *batcher[Req, Res]) do(ctx context.Context, req Req) (res Res, err error, ok bool) {
	item := batchItem[Req, Res]{req: req, out: make(chan batchResult[Res], 1)}
	b.mu.RLock()
	if b.stopped {
		b.mu.RUnlock()
		return res, nil, false
	}
	select {
	case b.in <- item:
		b.mu.RUnlock()
	case <-ctx.Done():
		b.mu.RUnlock()
		return res, ctx.Err(), true
	}
	// Once queued, the request is flushed whatever happens to ctx: wait for its result, so that a caller never
	// reports an outcome as unrecorded that the batch then records.
	r := <-item.out
	return r.res, r.err, true
}

// submit queues req for the next batch and returns at once (it waits only while the queue is full); done receives
// the result in the flusher's goroutine. ok is false when the batcher is stopped: done is not called, and the
// caller does the work itself.
func (b *batcher[Req, Res]) submit(req Req, done func(Res, error)) (ok bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.stopped {
		return false
	}
	b.in <- batchItem[Req, Res]{req: req, done: done}
	return true
}

func (b *batcher[Req, Res]) run() {
	defer close(b.done)
	items := make([]batchItem[Req, Res], 0, b.max)
	reqs := make([]Req, 0, b.max)
	for {
		first, open := <-b.in
		if !open {
			return
		}
		items = append(items[:0], first)
		var deadline <-chan time.Time
	drain:
		for len(items) < b.max {
			select {
			case it, open := <-b.in:
				if !open {
					break drain
				}
				items = append(items, it)
				continue
			default:
			}
			if b.expected == nil || len(items) >= b.expected() {
				break
			}
			// More requests are on their way: wait for them while they keep coming.
			if deadline == nil {
				deadline = time.After(b.linger)
			}
			pause := time.NewTimer(b.gap)
			select {
			case it, open := <-b.in:
				pause.Stop()
				if !open {
					break drain
				}
				items = append(items, it)
			case <-pause.C:
				break drain
			case <-deadline:
				pause.Stop()
				break drain
			}
		}
		reqs = reqs[:0]
		for _, it := range items {
			reqs = append(reqs, it.req)
		}
		ctx, cancel := context.WithTimeout(context.Background(), batchFlushTimeout)
		results := b.flush(ctx, reqs)
		cancel()
		for i, it := range items {
			if it.done != nil {
				it.done(results[i].res, results[i].err)
			} else {
				it.out <- results[i]
			}
		}
	}
}

// stop flushes what is queued and ends the flusher; later requests are refused (do returns ok = false).
func (b *batcher[Req, Res]) stop() {
	b.mu.Lock()
	if !b.stopped {
		b.stopped = true
		close(b.in)
	}
	b.mu.Unlock()
	<-b.done
}

// flushEach runs one batch through all, and when that fails with an error that retrying does not cure, every
// request on its own through one, so that a request the database refuses (a collect error, a repeated step)
// cannot fail the others. Lost connections are retried (retryDB) in both cases.
func flushEach[Req, Res any](ctx context.Context, reqs []Req, all func(context.Context, []Req) ([]Res, error),
	one func(context.Context, Req) (Res, error), logger *slog.Logger, what string) []batchResult[Res] {
	out := make([]batchResult[Res], len(reqs))
	var res []Res
	err := retryDB(ctx, func() (err error) {
		res, err = all(ctx, reqs)
		return err
	})
	if err == nil {
		for i := range reqs {
			out[i].res = res[i]
		}
		return out
	}
	if len(reqs) == 1 {
		out[0].err = err
		return out
	}
	logger.Warn("steps: batch failed; recording its entries one by one", slog.String("batch", what),
		slog.Int("size", len(reqs)), slog.Any("error", err))
	for i, r := range reqs {
		out[i].err = retryDB(ctx, func() (err error) {
			out[i].res, err = one(ctx, r)
			return err
		})
	}
	return out
}

// BatchRecorder records the outcomes of attempts in batches: each Complete or Fail joins the next flush, which
// sends stepready.complete_steps and stepready.fail_steps together, in one round trip and one transaction. Both
// fence every entry on its own exactly as complete_step and fail_step do. Complete and Fail return once their
// entry is recorded (or refused), so a worker that returns has its outcome in the database.
//
// A batch is flushed as soon as it holds as many entries as there are attempts running (Track counts them), or
// when no entry came for RecordGap, or after RecordLinger: a worker finishing alone is recorded at once, and
// workers finishing together (a batch claimed together) are recorded together.
type BatchRecorder struct {
	pool    *pgxpool.Pool
	logger  *slog.Logger
	b       *batcher[outcomeReq, outcomeRes]
	running atomic.Int64
}

// RecordGap and RecordLinger bound how long a BatchRecorder waits for the outcomes of other running attempts
// before it records the ones it has: no longer than RecordGap after the last one came, and no longer than
// RecordLinger in all.
const (
	RecordGap    = 200 * time.Microsecond
	RecordLinger = 2 * time.Millisecond
)

// outcomeReq is a completion (fail == nil) or a failure; token is the attempt's fencing token.
type outcomeReq struct {
	stepID int64
	token  int
	output json.RawMessage
	fail   json.RawMessage // the error document of a failure
}

type outcomeRes struct {
	completed bool
	failed    store.FailResult
}

// NewBatchRecorder starts a recorder on pool sending at most maxBatch entries per flush (0: BatchMaxDefault).
// Stop it after the last Complete or Fail has returned.
func NewBatchRecorder(pool *pgxpool.Pool, maxBatch int, logger *slog.Logger) *BatchRecorder {
	r := &BatchRecorder{pool: pool, logger: orDiscard(logger)}
	r.b = newBatcher(maxBatch, r.flush)
	r.b.expected = func() int { return int(r.running.Load()) }
	r.b.gap, r.b.linger = RecordGap, RecordLinger
	return r
}

// Track counts an attempt whose outcome may be recorded through r: call it with +1 when the attempt starts and
// -1 when its outcome is recorded, whatever it was.
func (r *BatchRecorder) Track(delta int) { r.running.Add(int64(delta)) }

// Complete records the successful attempt of a step (token: its fencing token) with its output; false when the
// attempt was fenced out. After Stop it records the attempt on its own (complete_step).
func (r *BatchRecorder) Complete(ctx context.Context, stepID int64, token int, output json.RawMessage) (bool, error) {
	res, err, batched := r.b.do(ctx, outcomeReq{stepID: stepID, token: token, output: output})
	if !batched {
		return store.CompleteStep(ctx, r.pool, stepID, token, output)
	}
	return res.completed, err
}

// Fail records the failed attempt of a step (token: its fencing token) with the error document of fail_step and
// returns what was decided (reason stale_attempt when the attempt was fenced out). After Stop it records the
// attempt on its own (fail_step).
func (r *BatchRecorder) Fail(ctx context.Context, stepID int64, token int, errorDoc json.RawMessage) (store.FailResult, error) {
	res, err, batched := r.b.do(ctx, outcomeReq{stepID: stepID, token: token, fail: errorDoc})
	if !batched {
		return store.FailStep(ctx, r.pool, stepID, token, errorDoc)
	}
	return res.failed, err
}

// CompleteAsync is Complete without the wait: it queues the successful attempt for the next batch and returns;
// done receives the result in the recorder's goroutine once the batch is recorded (it must be quick). Lost
// connections are retried as for every batch. After Stop it records the attempt on its own, retrying lost
// connections for up to a minute, then calls done.
func (r *BatchRecorder) CompleteAsync(ctx context.Context, stepID int64, token int, output json.RawMessage,
	done func(ok bool, err error)) {
	if !r.b.submit(outcomeReq{stepID: stepID, token: token, output: output},
		func(res outcomeRes, err error) { done(res.completed, err) }) {
		ctx, cancel := context.WithTimeout(ctx, batchFlushTimeout)
		defer cancel()
		var ok bool
		err := retryDB(ctx, func() (err error) {
			ok, err = store.CompleteStep(ctx, r.pool, stepID, token, output)
			return err
		})
		done(ok, err)
	}
}

// FailAsync is Fail without the wait, as CompleteAsync is Complete without it.
func (r *BatchRecorder) FailAsync(ctx context.Context, stepID int64, token int, errorDoc json.RawMessage,
	done func(store.FailResult, error)) {
	if !r.b.submit(outcomeReq{stepID: stepID, token: token, fail: errorDoc},
		func(res outcomeRes, err error) { done(res.failed, err) }) {
		ctx, cancel := context.WithTimeout(ctx, batchFlushTimeout)
		defer cancel()
		var res store.FailResult
		err := retryDB(ctx, func() (err error) {
			res, err = store.FailStep(ctx, r.pool, stepID, token, errorDoc)
			return err
		})
		done(res, err)
	}
}

// Stop records what is queued and stops batching.
func (r *BatchRecorder) Stop() { r.b.stop() }

func (r *BatchRecorder) flush(ctx context.Context, reqs []outcomeReq) []batchResult[outcomeRes] {
	return flushEach(ctx, reqs, func(ctx context.Context, reqs []outcomeReq) ([]outcomeRes, error) {
		var completions []store.Completion
		var failures []store.Failure
		for _, q := range reqs {
			if q.fail == nil {
				completions = append(completions, store.Completion{StepID: q.stepID, Token: q.token, Output: q.output})
			} else {
				failures = append(failures, store.Failure{StepID: q.stepID, Token: q.token, ErrorDoc: q.fail})
			}
		}
		done, failed, err := store.RecordOutcomes(ctx, r.pool, completions, failures)
		if err != nil {
			return nil, err
		}
		res := make([]outcomeRes, len(reqs))
		for i, q := range reqs {
			if q.fail == nil {
				res[i].completed = done[q.stepID]
			} else {
				res[i].failed = failed[q.stepID]
			}
		}
		return res, nil
	}, func(ctx context.Context, q outcomeReq) (outcomeRes, error) {
		if q.fail == nil {
			ok, err := store.CompleteStep(ctx, r.pool, q.stepID, q.token, q.output)
			return outcomeRes{completed: ok}, err
		}
		f, err := store.FailStep(ctx, r.pool, q.stepID, q.token, q.fail)
		return outcomeRes{failed: f}, err
	}, r.logger, "complete_steps + fail_steps")
}

// BatchStarter starts claimed steps in batches (stepready.start_steps), for workers that receive claimed steps
// one by one (River dispatch): each Start joins the next call.
type BatchStarter struct {
	pool   *pgxpool.Pool
	worker string
	lease  time.Duration
	logger *slog.Logger
	b      *batcher[int64, startRes]
}

type startRes struct {
	st store.Started
	ok bool
}

// NewBatchStarter starts a starter on pool for worker, leasing each attempt for lease, sending at most maxBatch
// steps per statement (0: BatchMaxDefault). Stop it after the last Start has returned.
func NewBatchStarter(pool *pgxpool.Pool, worker string, lease time.Duration, maxBatch int, logger *slog.Logger) *BatchStarter {
	if maxBatch <= 0 {
		maxBatch = BatchMaxDefault
	}
	s := &BatchStarter{pool: pool, worker: worker, lease: lease, logger: orDiscard(logger)}
	s.b = newBatcher(maxBatch, s.flush)
	// River hands a fetched batch of jobs to its workers one goroutine at a time: wait for the rest of them
	// while they keep coming (StartGap after the last one, StartLinger in all).
	s.b.expected = func() int { return maxBatch }
	s.b.gap, s.b.linger = StartGap, StartLinger
	return s
}

// StartGap and StartLinger bound how long a BatchStarter waits for more steps to start before it starts the ones
// it has: no longer than StartGap after the last one came, and no longer than StartLinger in all.
const (
	StartGap    = 50 * time.Microsecond
	StartLinger = time.Millisecond
)

// Start starts the attempt of an enqueued step; ok is false when the step must not run. After Stop it starts the
// step on its own (start_step).
func (s *BatchStarter) Start(ctx context.Context, stepID int64) (store.Started, bool, error) {
	r, err, batched := s.b.do(ctx, stepID)
	if !batched {
		return store.StartStep(ctx, s.pool, stepID, s.worker, s.lease)
	}
	return r.st, r.ok, err
}

// Stop starts what is queued and stops batching.
func (s *BatchStarter) Stop() { s.b.stop() }

func (s *BatchStarter) flush(ctx context.Context, ids []int64) []batchResult[startRes] {
	return flushEach(ctx, ids, func(ctx context.Context, ids []int64) ([]startRes, error) {
		started, err := store.StartSteps(ctx, s.pool, ids, s.worker, s.lease)
		if err != nil {
			return nil, err
		}
		res := make([]startRes, len(ids))
		for i, id := range ids {
			res[i].st, res[i].ok = started[id]
		}
		return res, nil
	}, func(ctx context.Context, id int64) (startRes, error) {
		st, ok, err := store.StartStep(ctx, s.pool, id, s.worker, s.lease)
		return startRes{st: st, ok: ok}, err
	}, s.logger, "start_steps")
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
