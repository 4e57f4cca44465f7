package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/metrics"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/rules"

	"github.com/stepready/stepready/steps"
)

// Executor defaults.
const (
	// AbandonGraceDefault is how long a handler may keep running after its context is done before the executor
	// stops waiting for it and records the attempt as failed.
	AbandonGraceDefault = 5 * time.Second
	// recordTimeout bounds how long recording one outcome may keep retrying a lost connection.
	recordTimeout = time.Minute
)

// attempt is one attempt being run: the step its handler sees, and the attempt's fencing token
// (store.Started.Token), which every write of the attempt carries and the handler never sees.
type attempt struct {
	*steps.Step
	token int
}

// errLeaseLost is the cancellation cause when a heartbeat finds the attempt is no longer the running one
// (cancelled, resolved, reset or reaped): nothing is recorded, the database refuses it anyway.
var errLeaseLost = errors.New("stepready: attempt is no longer the running one")

// fencedOutDoc is what the executor reports for an attempt whose heartbeat was refused, once its handler has
// returned. The database refuses it (the attempt is no longer the running one); the call only ends the lease an
// operator's action left behind.
var fencedOutDoc = json.RawMessage(`{"class": "canceled", "message": "attempt fenced out while running"}`)

// Executor runs claimed steps: start_step, the handler under the step's timeout with a heartbeat, then the
// outcome through complete_step, fail_step or continue_step. It is shared by every dispatcher.
type Executor struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Registry resolves handler names. Required.
	Registry *steps.Registry
	// Worker is this worker's id, recorded as lease owner. Required.
	Worker string
	// Lease is the attempt lease; the heartbeat renews it every Lease/3. Required (> 0).
	Lease time.Duration
	// DefaultTimeout applies to steps without timeout_ms. Zero means DefaultTimeout.
	DefaultTimeout time.Duration
	// AbandonGrace is how long to wait for a handler past its deadline. Zero means AbandonGraceDefault.
	AbandonGrace time.Duration
	// Logger receives per-attempt logs. Nil discards them.
	Logger *slog.Logger
	// Metrics records counters; nil records nothing.
	Metrics *metrics.Metrics
	// Starter, when set, starts the attempts of Run in batches (start_steps). Nil: one start_step per attempt.
	Starter *BatchStarter
	// MaxOutputBytes is the largest output, encoded as JSON, an attempt may record (SPEC §17); a larger one fails
	// the attempt as contract_failure naming the size instead of bloating the tables. Zero means
	// MaxOutputBytesDefault (1 MiB); negative means no limit. It applies to a repetition's output and next input
	// too.
	MaxOutputBytes int
	// Recorder, when set, records plain outcomes (no outcome rules, no repetition) in batches: successes with
	// complete_steps, failures with fail_steps. Nil: one complete_step or fail_step per attempt. Repetitions,
	// releases and rule decisions are always recorded one by one.
	Recorder *BatchRecorder
}

// Run executes one claimed step. ctx is the worker's context: when it is cancelled with cause ErrShutdown
// (context.WithCancelCause) the running handler is cancelled and the attempt handed back uncharged. claimedAt
// is when the step was claimed (for the claim-to-start latency; zero to skip). Run returns when the outcome is
// recorded; errors are logged, never returned: a worker must keep going.
func (e *Executor) Run(ctx context.Context, c store.ClaimedStep, claimedAt time.Time) {
	log := e.stepLogger(c)
	// Database writes outlive the worker's context: an outcome is recorded even during shutdown.
	dbCtx := context.WithoutCancel(ctx)

	var st store.Started
	var ok bool
	var err error
	if e.Starter != nil {
		st, ok, err = e.Starter.Start(dbCtx, c.StepID)
	} else {
		st, ok, err = store.StartStep(dbCtx, e.Pool, c.StepID, e.Worker, e.Lease)
	}
	if err != nil {
		log.Error("executor: start step", slog.Any("error", err))
		return
	}
	if !ok {
		log.Debug("executor: step no longer enqueued; skipped")
		return
	}
	if !claimedAt.IsZero() {
		e.Metrics.Started(time.Since(claimedAt))
	} else {
		e.Metrics.Started(0)
	}
	e.Reserve(1)
	e.run(ctx, c, st, nil, nil)
}

// RunStarted executes an attempt that is already started (claim_and_start_steps): the handler, then the
// outcome, exactly as Run does after its start, except that with a recorded callback it may return while a plain
// outcome (a success or failure of a step without rules) waits in the Recorder for its batch (the Recorder's Stop
// records everything queued). The caller has counted it with Reserve.
//
// handlerDone, when not nil, is called once as soon as the handler has returned (or when it will not run), before
// the outcome is recorded: a dispatcher can hand the handler's slot to the next attempt while this outcome waits
// for its batch. recorded, when not nil, is called once when the outcome is recorded (or could not be), possibly
// in the Recorder's goroutine after RunStarted returned: it must be quick.
func (e *Executor) RunStarted(ctx context.Context, c store.ClaimedStep, st store.Started, handlerDone, recorded func()) {
	e.Metrics.Started(0)
	e.run(ctx, c, st, handlerDone, recorded)
}

// Reserve tells the executor that n attempts already started are about to be run with RunStarted (a claimed
// batch): the batch recorder then expects their outcomes together. Call it before starting them.
func (e *Executor) Reserve(n int) {
	if e.Recorder != nil {
		e.Recorder.Track(n)
	}
}

func (e *Executor) run(ctx context.Context, c store.ClaimedStep, st store.Started, handlerDone, recorded func()) {
	dbCtx := context.WithoutCancel(ctx)
	if handlerDone == nil {
		handlerDone = func() {}
	}
	finished := func() {
		if e.Recorder != nil {
			e.Recorder.Track(-1)
		}
		if recorded != nil {
			recorded()
		}
	}
	log := e.attemptLogger(c, st)
	log.Info("executor: attempt started")

	step := &attempt{Step: &steps.Step{ID: c.StepID, TaskID: c.TaskID, Name: c.Name, Handler: c.Handler,
		Input: st.Input, Context: st.Context, Deps: st.Deps, Element: st.Element, Index: st.Index,
		Attempt: st.Attempt, Iteration: st.Iteration, Queue: c.Queue, Rules: st.Rules}, token: st.Token}
	// A row that breaks the bounds the tables hold (written around their constraints) fails alone, before its
	// handler runs: its values cannot be used (a timeout no time.Duration holds would wrap to a deadline already
	// past).
	if err := c.Check(); err != nil {
		e.Metrics.Finished(0)
		handlerDone()
		e.record(dbCtx, log, step, nil, result{unusable: err})
		finished()
		return
	}
	if c.TimeoutMS != nil {
		step.Timeout = time.Duration(*c.TimeoutMS) * time.Millisecond
	}
	// The rules are compiled before the handler runs (cached by content: once per distinct document): rules that
	// do not compile fail the attempt without running the handler, whose effects could not be judged anyway.
	var prog *rules.Program
	if hasRules(step.Rules) {
		var err error
		if prog, err = rules.Compile(step.Rules); err != nil {
			e.Metrics.Finished(0)
			handlerDone()
			e.record(dbCtx, log, step, nil, result{rulesErr: err})
			finished()
			return
		}
	}
	begin := time.Now()
	res := e.runHandler(ctx, dbCtx, step, c.Timeout(e.defaultTimeout()))
	e.Metrics.Finished(time.Since(begin))
	handlerDone()
	// Only a caller that learns of the record through recorded may return before it: the River dispatcher's
	// worker returns when Run does, and its return is what wakes the claimer after a retry is scheduled.
	if recorded != nil && e.recordQueued(dbCtx, log, step, prog, res, finished) {
		return
	}
	e.record(dbCtx, log, step, prog, res)
	finished()
}

// recordQueued hands a plain outcome (a success or a failure of a step without rules) to the Recorder without
// waiting for its batch, and reports whether it did; finished is then called once the outcome is recorded, in the
// Recorder's goroutine. Every other outcome (rules, repetitions, releases, lost leases) is left to record.
func (e *Executor) recordQueued(ctx context.Context, log *slog.Logger, step *attempt, prog *rules.Program, r result,
	finished func()) bool {
	if e.Recorder == nil || prog != nil || r.leaseLost || r.released || r.rulesErr != nil || r.unusable != nil {
		return false
	}
	if _, repeat := errors.AsType[*steps.RepeatRequest](r.err); repeat {
		return false // a repetition: record works out the outcome and calls continue_step
	}
	o := outcomeOf(r, e.maxOutputBytes())
	switch {
	case o.failure != nil:
		doc, err := marshalErrorDoc(*o.failure)
		if err != nil {
			return false
		}
		d := *o.failure
		e.Recorder.FailAsync(ctx, step.ID, step.token, doc, func(res store.FailResult, err error) {
			if err != nil {
				e.refusedOrUnrecorded(ctx, log, step, err, finished)
				return
			}
			e.failed(log, d, res)
			finished()
		})
	default:
		e.Recorder.CompleteAsync(ctx, step.ID, step.token, o.output, func(ok bool, err error) {
			if err != nil {
				e.refusedOrUnrecorded(ctx, log, step, err, finished)
				return
			}
			e.succeeded(log, ok)
			finished()
		})
	}
	return true
}

// refusedOrUnrecorded handles the error of an outcome queued in the Recorder, in its goroutine: an outcome the
// database refused for its content is recorded as a contract_failure (refused) before finished is called, any other
// error is logged. The refusal is recorded right there, holding up the recorder's next batch by one round trip: it
// is rare, and done there it is finished before the recorder stops (Stop waits for it), so nothing outlives
// shutdown.
func (e *Executor) refusedOrUnrecorded(ctx context.Context, log *slog.Logger, step *attempt, err error, finished func()) {
	defer finished()
	if !refusedForContent(err) {
		logUnrecorded(log, err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	if err := retryDB(ctx, func() error { return e.refused(ctx, log, step, err) }); err != nil {
		logUnrecorded(log, err)
	}
}

func logUnrecorded(log *slog.Logger, err error) {
	log.Error("executor: could not record the outcome; the lease will expire and the reaper retries it",
		slog.Any("error", err))
}

// result is what an attempt came to.
type result struct {
	output   any
	err      error
	panicked any
	stack    []byte
	// released: the daemon is shutting down; hand the attempt back.
	released bool
	// leaseLost: the attempt was fenced out while running; record nothing.
	leaseLost bool
	// abandoned: the handler did not return after its context ended.
	abandoned bool
	// timedOut: the step's timeout expired.
	timedOut bool
	// rulesErr: the step's rules do not compile; the handler did not run.
	rulesErr error
	// unusable: the claim row breaks a bound of the tables (store.ClaimedStep.Check); the handler did not run.
	unusable error
}

func (e *Executor) runHandler(ctx, dbCtx context.Context, step *attempt, timeout time.Duration) result {
	h, ok := e.Registry.Lookup(step.Handler)
	if !ok {
		return result{err: &steps.Error{Class: steps.ClassDeterministic, Err: fmt.Errorf(
			"no handler named %q is registered on worker %s (registered: %v)", step.Handler, e.Worker, e.Registry.Names())}}
	}

	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	hctx, cancelTimeout := context.WithTimeout(runCtx, timeout)
	defer cancelTimeout()

	// Heartbeat at a third of the lease; a refused heartbeat means the attempt was fenced out.
	defer e.heartbeat(dbCtx, step, cancelRun)()

	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r = result{panicked: p, stack: debug.Stack()}
			}
			done <- r
		}()
		r.output, r.err = h.Handle(hctx, step.Step)
	}()

	var r result
	select {
	case r = <-done:
	case <-hctx.Done():
		select {
		case r = <-done:
		case <-time.After(e.abandonGrace()):
			r = result{abandoned: true}
		}
	}
	// A repetition is a result like a success: a handler that repeats after its context ended keeps it.
	_, repeated := errors.AsType[*steps.RepeatRequest](r.err)
	failed := (r.err != nil && !repeated) || r.abandoned
	switch cause := context.Cause(runCtx); {
	case errors.Is(cause, errLeaseLost):
		r.leaseLost = true
	case errors.Is(cause, steps.ErrShutdown) && failed:
		// Stopped by shutdown: not the step's fault. A handler that finished anyway keeps its result.
		r.released = true
	case errors.Is(hctx.Err(), context.DeadlineExceeded) && failed:
		r.timedOut = true
	}
	return r
}

// heartbeat renews the attempt's lease every Lease/3 until the returned stop is called. A refused heartbeat
// means the attempt was fenced out (cancelled, resolved, reaped): it cancels the handler with errLeaseLost. It is a
// timer, not a goroutine: an attempt shorter than Lease/3 (most of them) costs no goroutine and sends nothing.
func (e *Executor) heartbeat(ctx context.Context, step *attempt, cancelRun context.CancelCauseFunc) (stop func()) {
	interval := e.Lease / 3
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock() // t is assigned before the first beat can read it
	defer mu.Unlock()
	t = time.AfterFunc(interval, func() {
		ok, err := store.HeartbeatStep(ctx, e.Pool, step.ID, step.token, e.Lease)
		if err == nil && !ok {
			cancelRun(errLeaseLost)
			return
		}
		if err != nil {
			// A lost connection: keep trying; the lease covers two more beats.
			e.logger().Warn("executor: heartbeat failed", slog.Int64("step_id", step.ID), slog.Any("error", err))
		}
		mu.Lock()
		if !stopped {
			t.Reset(interval)
		}
		mu.Unlock()
	})
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// record writes the attempt's outcome, retrying transient database errors on an uncancelled context. prog is
// the step's compiled rules, nil when it has none.
func (e *Executor) record(ctx context.Context, log *slog.Logger, step *attempt, prog *rules.Program, r result) {
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	err := retryDB(ctx, func() error { return e.recordOnce(ctx, log, step, prog, r) })
	if err != nil && refusedForContent(err) {
		// The database refused the outcome for what it holds: record that at once instead of leaving the lease
		// to expire (the reaper would fail the attempt as stalled and run the handler again).
		refusal := err
		err = retryDB(ctx, func() error { return e.refused(ctx, log, step, refusal) })
	}
	if err != nil {
		logUnrecorded(log, err)
	}
}

func (e *Executor) recordOnce(ctx context.Context, log *slog.Logger, step *attempt, prog *rules.Program, r result) error {
	switch {
	case r.leaseLost && r.abandoned:
		// The handler is still running: its slot stays taken until its lease expires.
		log.Warn("executor: attempt was cancelled, resolved, reset or reaped while running, and its handler " +
			"did not return; its result is dropped and its lease left to expire")
		return nil
	case r.leaseLost:
		// The handler has returned: report it, so that the database ends the attempt's lease at once if an
		// operator left it running (an orphaned lease holds the step's concurrency slot). The report is fenced
		// like any other write of the attempt: it is refused and changes nothing else.
		res, err := store.FailStep(ctx, e.Pool, step.ID, step.token, fencedOutDoc)
		if err != nil {
			return err
		}
		log.Warn("executor: attempt was cancelled, resolved, reset or reaped while running; its result is dropped",
			slog.Bool("refused", res.Stale()))
		return nil
	case r.released:
		token := step.token
		ok, err := store.ReleaseStep(ctx, e.Pool, step.ID, &token)
		if err != nil {
			return err
		}
		if ok {
			e.Metrics.Released()
		}
		log.Info("executor: attempt released at shutdown", slog.Bool("released", ok))
		return nil
	case r.rulesErr != nil:
		return e.failUncompiledRules(ctx, log, step, r.rulesErr)
	case r.unusable != nil:
		log.Warn("executor: the claimed row cannot be run; the step fails", slog.Any("error", r.unusable))
		return e.fail(ctx, log, step, undispatchableDoc(step.Name, r.unusable))
	}

	o := outcomeOf(r, e.maxOutputBytes())
	if prog != nil {
		return e.recordWithRules(ctx, log, step, prog, o)
	}
	switch {
	case o.failure != nil:
		return e.fail(ctx, log, step, *o.failure)
	case o.repeat != nil:
		ok, err := store.ContinueStep(ctx, e.Pool, step.ID, step.token, o.output, o.repeat.nextInput, o.repeat.delay)
		if err != nil {
			return err
		}
		e.Metrics.Completed()
		log.Info("executor: iteration done; step repeats", slog.Duration("delay", o.repeat.delay), slog.Bool("recorded", ok))
		return nil
	}
	var ok bool
	var err error
	if e.Recorder != nil {
		ok, err = e.Recorder.Complete(ctx, step.ID, step.token, o.output)
	} else {
		ok, err = store.CompleteStep(ctx, e.Pool, step.ID, step.token, o.output)
	}
	if err != nil {
		return err
	}
	e.succeeded(log, ok)
	return nil
}

// succeeded counts and logs a recorded success (ok false: the attempt was fenced out).
func (e *Executor) succeeded(log *slog.Logger, ok bool) {
	e.Metrics.Completed()
	log.Info("executor: attempt succeeded", slog.Bool("recorded", ok))
}

// attemptOutcome is what a finished attempt came to, in the form it is recorded: exactly one of a failure, a
// requested repetition or a plain success.
type attemptOutcome struct {
	// failure is the error document of a failed attempt (a handler error, a panic, an abandoned or timed out
	// handler, an output that does not encode); nil when the attempt succeeded.
	failure *errorDoc
	// output is a successful attempt's output as JSON (also the iteration's output of a repetition).
	output json.RawMessage
	// repeat is set when the handler returned steps.Repeat.
	repeat *repeatPlan
	// httpStatus is a successful output's HTTP status (OutputWithHTTPStatus), 0 without one.
	httpStatus int
}

// repeatPlan is a handler's steps.Repeat, encoded.
type repeatPlan struct {
	nextInput json.RawMessage // nil keeps the input
	delay     time.Duration
}

// outcomeOf turns the handler's result into the outcome that is recorded, with or without rules: every failure
// has its error document here, so rules see panics and abandoned handlers with the class, message and stack
// recorded for them.
func outcomeOf(r result, maxOutput int) attemptOutcome {
	fail := func(d errorDoc) attemptOutcome { return attemptOutcome{failure: &d} }
	// what prefixes a storable error ("handler output: "; the next input's failure adds its own prefix).
	encodeJSON := func(what string, v any) (json.RawMessage, error) {
		b, err := encodeJSON(v)
		if err != nil {
			return nil, err
		}
		// What jsonb cannot hold is replaced (invalid UTF-8, lone surrogates) or refused (NUL) here, before the
		// database sees it (storable.go).
		if b, err = storableJSON(b, false); err != nil {
			return nil, fmt.Errorf("%s%w", what, err)
		}
		if maxOutput >= 0 && len(b) > maxOutput {
			return nil, fmt.Errorf("handler output is %d bytes, over the limit of %d bytes (--max-output-bytes)",
				len(b), maxOutput)
		}
		return b, nil
	}
	switch {
	case r.panicked != nil:
		return fail(errorDoc{Class: steps.ClassPermanent, Message: fmt.Sprintf("handler panicked: %v", r.panicked),
			Stack: string(r.stack)})
	case r.abandoned:
		return fail(errorDoc{Class: steps.ClassTimeout, Message: "handler ignored the end of its context and was abandoned"})
	}
	if rep, ok := errors.AsType[*steps.RepeatRequest](r.err); ok {
		out, err := encodeJSON("handler output: ", rep.Output)
		if err != nil {
			return fail(errorDoc{Class: steps.ClassContractFailure, Message: err.Error()})
		}
		if rep.Delay < 0 {
			// As for a retry delay (SPEC §4) and continue_step's p_delay_ms: a negative delay is bad input.
			return fail(errorDoc{Class: steps.ClassContractFailure, Message: fmt.Sprintf(
				"handler requested a negative repeat delay (%s); a delay must be >= 0", rep.Delay)})
		}
		plan := &repeatPlan{delay: rep.Delay}
		if rep.NextInput != nil {
			if plan.nextInput, err = encodeJSON("", rep.NextInput); err != nil {
				return fail(errorDoc{Class: steps.ClassContractFailure, Message: "next input: " + err.Error()})
			}
		}
		return attemptOutcome{output: out, repeat: plan}
	}
	if r.err != nil {
		return fail(classify(r.err, r.timedOut))
	}
	out, err := encodeJSON("handler output: ", r.output)
	if err != nil {
		return fail(errorDoc{Class: steps.ClassContractFailure, Message: err.Error()})
	}
	o := attemptOutcome{output: out}
	if s, ok := r.output.(steps.OutputWithHTTPStatus); ok {
		o.httpStatus = s.HTTPStatus()
	}
	return o
}

func (e *Executor) fail(ctx context.Context, log *slog.Logger, step *attempt, d errorDoc) error {
	if e.Recorder == nil {
		return e.failOn(ctx, e.Pool, log, step, d)
	}
	return e.failWith(log, d, func(doc json.RawMessage) (store.FailResult, error) {
		return e.Recorder.Fail(ctx, step.ID, step.token, doc)
	})
}

func (e *Executor) failOn(ctx context.Context, db store.DBTX, log *slog.Logger, step *attempt, d errorDoc) error {
	return e.failWith(log, d, func(doc json.RawMessage) (store.FailResult, error) {
		return store.FailStep(ctx, db, step.ID, step.token, doc)
	})
}

func (e *Executor) failWith(log *slog.Logger, d errorDoc, record func(json.RawMessage) (store.FailResult, error)) error {
	doc, err := marshalErrorDoc(d)
	if err != nil {
		return err
	}
	res, err := record(doc)
	if err != nil {
		return err
	}
	e.failed(log, d, res)
	return nil
}

// marshalErrorDoc encodes a failure for fail_step, with what jsonb cannot hold (NUL, invalid UTF-8, lone
// surrogates) replaced by U+FFFD: a failure is always recorded.
func marshalErrorDoc(d errorDoc) (json.RawMessage, error) {
	doc, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("steps: encode error document: %w", err)
	}
	return storableJSON(doc, true)
}

// failed counts and logs a recorded failure.
func (e *Executor) failed(log *slog.Logger, d errorDoc, res store.FailResult) {
	// A label value must be valid UTF-8 (Prometheus panics otherwise), and a handler chooses the class.
	e.Metrics.Failed(strings.ToValidUTF8(d.Class, "\uFFFD"), res.State == "waiting_for_retry")
	attrs := []any{slog.String("class", d.Class), slog.String("message", d.Message), slog.String("state", res.State)}
	if res.NextAttemptAt != nil {
		attrs = append(attrs, slog.Time("next_attempt_at", *res.NextAttemptAt))
	}
	if res.Reason != nil {
		attrs = append(attrs, slog.String("reason", *res.Reason))
	}
	log.Info("executor: attempt failed", attrs...)
}

// errorDoc is the p_error document of stepready.fail_step.
type errorDoc struct {
	Class        string          `json:"class"`
	Message      string          `json:"message"`
	Code         string          `json:"code,omitempty"`
	HTTPStatus   int             `json:"http_status,omitempty"`
	RetryAfterMS *int64          `json:"retry_after_ms,omitempty"`
	Retryable    *bool           `json:"retryable,omitempty"`
	Stack        string          `json:"stack,omitempty"`
	Retry        json.RawMessage `json:"retry,omitempty"` // a rule's policy overrides for this failure
	Rule         map[string]any  `json:"rule,omitempty"`  // the rule that decided
}

// classify turns a handler error into the error document: a classified *Error keeps its class; an unclassified
// error is transient, or timeout when the step's deadline passed. An *Error asking for a negative RetryAfter is
// a `contract_failure` whose message names the value and keeps the handler's class and message.
func classify(err error, timedOut bool) errorDoc {
	d := errorDoc{Class: steps.ClassTransient, Message: err.Error()}
	if timedOut {
		d.Class = steps.ClassTimeout
	}
	if e, ok := steps.AsError(err); ok {
		d.Class = cmp.Or(e.Class, steps.ClassTransient)
		if e.Err != nil {
			d.Message = e.Err.Error()
		}
		d.Code, d.HTTPStatus = e.Code, e.HTTPStatus
		switch {
		case e.RetryAfter != nil && *e.RetryAfter < 0:
			// SPEC §4: a requested delay must be >= 0; a negative one is bad input from the handler, recorded
			// as such with everything the handler said.
			d.Message = fmt.Sprintf("handler requested a negative retry delay (%s); a delay must be >= 0. "+
				"The handler's error (class %s): %s", *e.RetryAfter, d.Class, d.Message)
			d.Class = steps.ClassContractFailure
		case e.RetryAfter != nil:
			ms := e.RetryAfter.Milliseconds()
			d.RetryAfterMS = &ms
		}
		if e.NotRetryable {
			f := false
			d.Retryable = &f
		}
	}
	return d
}

// maxOutputBytes is MaxOutputBytes with its default; -1 for no limit.
func (e *Executor) maxOutputBytes() int {
	switch {
	case e.MaxOutputBytes == 0:
		return steps.MaxOutputBytesDefault
	case e.MaxOutputBytes < 0:
		return -1
	}
	return e.MaxOutputBytes
}

func encodeJSON(v any) (json.RawMessage, error) {
	switch v := v.(type) {
	case json.RawMessage:
		if len(v) == 0 {
			return json.RawMessage("null"), nil
		}
		if !json.Valid(v) {
			return nil, errors.New("handler output is not valid JSON")
		}
		return v, nil
	case nil:
		return json.RawMessage("null"), nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("handler output does not encode as JSON: %w", err)
	}
	return b, nil
}

func (e *Executor) logger() *slog.Logger {
	if e.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Logger
}

func (e *Executor) defaultTimeout() time.Duration {
	if e.DefaultTimeout > 0 {
		return e.DefaultTimeout
	}
	return steps.DefaultTimeout
}

func (e *Executor) abandonGrace() time.Duration {
	if e.AbandonGrace > 0 {
		return e.AbandonGrace
	}
	return AbandonGraceDefault
}
