// Package store is stepready's one seam to PostgreSQL: typed calls of the SQL functions of the stepready schema.
// Every rule (readiness, retries, fencing) lives in those functions; this package only moves values across.
//
// Each function takes a DBTX, so the same call runs on a pool, a connection or inside a transaction (the River
// dispatcher claims and inserts its jobs in one transaction).
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// DBTX is what the calls need: satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ClaimedStep is one row returned by stepready.claim_ready_steps: the step is now enqueued under a lease.
type ClaimedStep struct {
	StepID    int64           `json:"step_id"`
	TaskID    int64           `json:"task_id"`
	Name      string          `json:"name"`
	Handler   string          `json:"handler"`
	Input     json.RawMessage `json:"input,omitempty"`
	Attempts  int             `json:"attempts"`
	TimeoutMS *int64          `json:"timeout_ms,omitempty"`
	Queue     string          `json:"queue"`
	// DecodeErr is set when a column of the row did not decode (StepID, and Attempts or the attempt of a started
	// row, are then still right): the row cannot be run, and Check returns it.
	DecodeErr error `json:"-"`
}

// Timeout returns the step's per-attempt timeout, or def when it sets none.
func (c ClaimedStep) Timeout(def time.Duration) time.Duration {
	if c.TimeoutMS == nil {
		return def
	}
	return time.Duration(*c.TimeoutMS) * time.Millisecond
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// raw makes a json/jsonb column scan into p as the bytes PostgreSQL sent: pgx would otherwise run a JSON decoder
// over every document to fill a json.RawMessage (the database already guarantees it is valid JSON).
func raw(p *json.RawMessage) *[]byte { return (*[]byte)(p) }

// ClaimReadySteps claims up to limit ready steps for worker with an enqueued lease.
func ClaimReadySteps(ctx context.Context, db DBTX, limit int, worker string, lease time.Duration) ([]ClaimedStep, error) {
	rows, err := db.Query(ctx, claimReadySQL, limit, worker, ms(lease))
	if err != nil {
		return nil, fmt.Errorf("store: claim ready steps: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, scanClaimed)
	if err != nil {
		return nil, fmt.Errorf("store: claim ready steps: %w", err)
	}
	return claimed, nil
}

const claimReadySQL = `SELECT step_id, task_id, name, handler, input, attempts, timeout_ms, queue
	FROM stepready.claim_ready_steps($1, $2, $3)`

// Routes restricts a claim to the steps a worker can take (SPEC §21: the claim functions' p_queues and
// p_handlers). A nil slice allows any (NULL); an empty, non-nil one allows none.
type Routes struct {
	// Queues are the queues whose steps the claim takes.
	Queues []string
	// Handlers are the handler names whose steps the claim takes.
	Handlers []string
}

// claimReadyRoutedSQL is claimReadySQL with the routing filters ($4, $5), p_as_of left to its default.
const claimReadyRoutedSQL = `SELECT step_id, task_id, name, handler, input, attempts, timeout_ms, queue
	FROM stepready.claim_ready_steps($1, $2, $3, p_queues => $4, p_handlers => $5)`

// The claim rows are scanned into nullable values, which cannot fail to scan: a scan error would end the whole
// result (pgx closes the rows), and with it the dispatch of every step of the claim. A value that is missing where
// one is required makes that row's DecodeErr instead, and the dispatcher fails that step alone.
func scanClaimed(r pgx.CollectableRow) (ClaimedStep, error) {
	var c ClaimedStep
	var taskID *int64
	var name, handler, queue *string
	var attempts *int
	if err := r.Scan(&c.StepID, &taskID, &name, &handler, raw(&c.Input), &attempts, &c.TimeoutMS, &queue); err != nil {
		return c, err
	}
	var d decoding
	c.TaskID, c.Name, c.Handler = need(&d, taskID, "task_id"), need(&d, name, "name"), need(&d, handler, "handler")
	c.Attempts, c.Queue = need(&d, attempts, "attempts"), need(&d, queue, "queue")
	c.DecodeErr = d.err(c.StepID)
	return c, nil
}

// decoding collects the required columns of one claim row that came back NULL.
type decoding struct{ missing []string }

func need[T any](d *decoding, p *T, column string) T {
	if p == nil {
		d.missing = append(d.missing, column)
		var zero T
		return zero
	}
	return *p
}

func (d *decoding) err(stepID int64) error {
	if len(d.missing) == 0 {
		return nil
	}
	return fmt.Errorf("the claim row of step %d does not decode: no value for %s", stepID,
		strings.Join(d.missing, ", "))
}

// ClaimReadyStepsNextDue is ClaimReadySteps of the steps routes allows, preceded, in the same round trip, by
// next_claim_at (see ClaimAndStartStepsNextDue). Pass a transaction to keep the claim in it.
func ClaimReadyStepsNextDue(ctx context.Context, db BatchSender, limit int, worker string, lease time.Duration,
	routes Routes) ([]ClaimedStep, NextDue, error) {
	got, due, err := claimWithNextDue(ctx, db, limit, scanClaimed, claimReadyRoutedSQL, limit, worker, ms(lease),
		routes.Queues, routes.Handlers)
	if err != nil {
		return nil, NextDue{}, fmt.Errorf("store: claim ready steps: %w", err)
	}
	return got, due, nil
}

// claimWithNextDue runs next_claim_at, then the claim query, in one round trip and one transaction (a batch
// outside a transaction is one implicit transaction): both see the same now(), and the due time is read before
// the claim, so a step whose backoff ends after the claim's instant is in it and one that ended before is
// claimable by the claim.
func claimWithNextDue[T any](ctx context.Context, db BatchSender, capHint int, scan pgx.RowToFunc[T], query string,
	args ...any) ([]T, NextDue, error) {
	var due NextDue
	b := &pgx.Batch{}
	b.Queue(nextDueSQL).QueryRow(func(r pgx.Row) error {
		var at pgtype.Timestamptz
		err := r.Scan(&at, &due.DBNow, &due.Wakeups, &due.XMax)
		due.At = finiteTime(at)
		return err
	})
	var got []T
	b.Queue(query, args...).Query(func(rows pgx.Rows) error {
		var err error
		got, err = pgx.AppendRows(make([]T, 0, min(capHint, 128)), rows, scan)
		return err
	})
	// A claim that leaves rate-limited steps behind records when their key's next token arrives (SPEC §14):
	// read after the claim, so the timer wakes for it instead of waiting for the poll interval.
	var flowAt *time.Time
	b.Queue(`SELECT stepready.next_flow_at()`).QueryRow(func(r pgx.Row) error {
		var at pgtype.Timestamptz
		err := r.Scan(&at)
		flowAt = finiteTime(at)
		return err
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return nil, NextDue{}, err
	}
	if flowAt != nil && (due.At == nil || flowAt.Before(*due.At)) {
		due.At = flowAt
	}
	return got, due, nil
}

// finiteTime is a due time as the daemon's timer takes it: nil for none, and for 'infinity' (never) too. The
// tables keep infinite due times out (steps_next_attempt_at_is_finite); were one there anyway, it must not make
// every claim fail to scan its wake-up time. '-infinity' is due at once: the earliest time Go holds.
func finiteTime(t pgtype.Timestamptz) *time.Time {
	switch {
	case !t.Valid || t.InfinityModifier == pgtype.Infinity:
		return nil
	case t.InfinityModifier == pgtype.NegativeInfinity:
		return &time.Time{}
	}
	return &t.Time
}

// Started is an attempt that start_step let run, with what its handler needs beyond the claim.
type Started struct {
	// Token is the attempt's fencing token (the `attempt` column of the start functions): every later call of the
	// attempt (heartbeat, complete, fail, continue, release, policy evaluation) carries it. It never repeats for
	// a step; it equals Attempt until the step is reset or repeats.
	Token int
	// Attempt is the attempt's number within the current iteration (1-based): what users, rules, logs and events
	// see.
	Attempt int
	// Iteration is the step's iteration (repeating steps).
	Iteration int
	// Input is the step's current input, with its references resolved (SPEC §18).
	Input json.RawMessage
	// Context is the task's context.
	Context json.RawMessage
	// Deps is the step's deps object: its direct parents' outputs by name (SPEC §18).
	Deps json.RawMessage
	// Element is a map element's array item (SPEC §19); nil for a step that is not an element.
	Element json.RawMessage
	// Index is a map element's 0-based index, or -1 for a step that is not an element.
	Index int
	// Rules is the step's outcome rules (NULL when it has none).
	Rules json.RawMessage
}

// StartStep moves an enqueued step to in_progress. ok is false when the step must not run (no longer enqueued,
// or its task stopped being runnable): the worker then drops it.
func StartStep(ctx context.Context, db DBTX, stepID int64, worker string, lease time.Duration) (Started, bool, error) {
	// start_steps of one step (what start_step does): one round trip, with the token, the attempt number and the
	// run context in its row.
	var st Started
	var token, attempt, iteration, index *int
	err := db.QueryRow(ctx, `SELECT attempt, attempt_number, iteration, input, context, rules, deps, element,
		element_index FROM stepready.start_steps(ARRAY[$1::bigint], $2, $3)`, stepID, worker, ms(lease)).
		Scan(&token, &attempt, &iteration, raw(&st.Input), raw(&st.Context), raw(&st.Rules), raw(&st.Deps),
			raw(&st.Element), &index)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return Started{}, false, nil
		}
		return Started{}, false, fmt.Errorf("store: start step %d: %w", stepID, err)
	}
	if token == nil || attempt == nil || iteration == nil {
		return Started{}, false, nil
	}
	st.Token, st.Attempt, st.Iteration, st.Index = *token, *attempt, *iteration, elementIndex(index)
	return st, true, nil
}

// ClaimedStarted is one row of stepready.claim_and_start_steps: a step claimed and started in one statement.
type ClaimedStarted struct {
	// ClaimedStep is the claim; its Attempts is the count before this attempt (Started.Attempt - 1).
	ClaimedStep
	// Started is the running attempt.
	Started Started
}

// ClaimAndStartSteps claims up to limit ready steps for worker and starts them at once (stepready.
// claim_and_start_steps): each returned attempt runs under a lease of lease from now.
func ClaimAndStartSteps(ctx context.Context, db DBTX, limit int, worker string, lease time.Duration) ([]ClaimedStarted, error) {
	rows, err := db.Query(ctx, claimAndStartSQL, limit, worker, ms(lease))
	if err != nil {
		return nil, fmt.Errorf("store: claim and start steps: %w", err)
	}
	got, err := pgx.CollectRows(rows, scanClaimedStarted)
	if err != nil {
		return nil, fmt.Errorf("store: claim and start steps: %w", err)
	}
	return got, nil
}

// BatchSender is what ClaimAndStartStepsNextDue needs: satisfied by *pgxpool.Pool and *pgx.Conn.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// NextDue is next_claim_at read with a claim: when the next claimable step becomes due after the claim's instant
// (nil: none is waiting on a backoff), and the database's clock at that instant.
type NextDue struct {
	At    *time.Time
	DBNow time.Time
	// Wakeups is the wake-up counter (wake_count) read before the claim: a later probe that reads another value
	// knows that something may have become claimable since.
	Wakeups int64
	// XMax is the transaction horizon read with Wakeups (xmax of a snapshot: every transaction that could have
	// advanced the counter so far has an id below it).
	XMax int64
}

// nextDueSQL reads next_claim_at, the clock, the wake-up counter and the transaction horizon in one statement.
const nextDueSQL = `SELECT stepready.next_claim_at(), now(), stepready.wake_count(),
	pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint`

const claimAndStartSQL = `SELECT step_id, task_id, name, handler, input, attempt, attempt_number, timeout_ms, queue,
	iteration, context, rules, deps, element, element_index FROM stepready.claim_and_start_steps($1, $2, $3)`

// elementIndex is a start row's element_index as Started.Index: -1 for NULL (not an element).
func elementIndex(i *int) int {
	if i == nil {
		return -1
	}
	return *i
}

// claimAndStartRoutedSQL is claimAndStartSQL with the routing filters ($4, $5), p_as_of left to its default.
const claimAndStartRoutedSQL = `SELECT step_id, task_id, name, handler, input, attempt, attempt_number, timeout_ms,
	queue, iteration, context, rules, deps, element, element_index
	FROM stepready.claim_and_start_steps($1, $2, $3, p_queues => $4, p_handlers => $5)`

// ClaimAndStartStepsNextDue is ClaimAndStartSteps of the steps routes allows, preceded, in the same transaction
// and round trip, by next_claim_at: both use the transaction's now(), and the due time is read before the claim,
// so a step whose backoff ends after the claim's instant is in it and one that ended before is claimable by the
// claim.
func ClaimAndStartStepsNextDue(ctx context.Context, db BatchSender, limit int, worker string, lease time.Duration,
	routes Routes) ([]ClaimedStarted, NextDue, error) {
	got, due, err := claimWithNextDue(ctx, db, limit, scanClaimedStarted, claimAndStartRoutedSQL, limit, worker,
		ms(lease), routes.Queues, routes.Handlers)
	if err != nil {
		return nil, NextDue{}, fmt.Errorf("store: claim and start steps: %w", err)
	}
	return got, due, nil
}

func scanClaimedStarted(r pgx.CollectableRow) (ClaimedStarted, error) {
	var c ClaimedStarted
	var taskID *int64
	var name, handler, queue *string
	var token, attempt, iteration, index *int
	if err := r.Scan(&c.StepID, &taskID, &name, &handler, raw(&c.Input), &token, &attempt, &c.TimeoutMS, &queue,
		&iteration, raw(&c.Started.Context), raw(&c.Started.Rules), raw(&c.Started.Deps), raw(&c.Started.Element),
		&index); err != nil {
		return c, err
	}
	c.Started.Index = elementIndex(index)
	var d decoding
	c.TaskID, c.Name, c.Handler = need(&d, taskID, "task_id"), need(&d, name, "name"), need(&d, handler, "handler")
	c.Started.Token, c.Started.Attempt = need(&d, token, "attempt"), need(&d, attempt, "attempt_number")
	c.Queue = need(&d, queue, "queue")
	c.Started.Iteration = need(&d, iteration, "iteration")
	c.Attempts = c.Started.Attempt - 1
	c.Started.Input = c.Input
	c.DecodeErr = d.err(c.StepID)
	return c, nil
}

// StartSteps starts a batch of enqueued steps (stepready.start_steps). The map holds the steps that may run;
// an id missing from it must not run (no longer enqueued, or its task stopped being runnable).
func StartSteps(ctx context.Context, db DBTX, stepIDs []int64, worker string, lease time.Duration) (map[int64]Started, error) {
	rows, err := db.Query(ctx, `SELECT step_id, attempt, attempt_number, iteration, input, context, rules, deps,
		element, element_index FROM stepready.start_steps($1, $2, $3)`, stepIDs, worker, ms(lease))
	if err != nil {
		return nil, fmt.Errorf("store: start %d steps: %w", len(stepIDs), err)
	}
	started := make(map[int64]Started, len(stepIDs))
	var id int64
	var token, attempt, iteration, index *int
	var st Started
	_, err = pgx.ForEachRow(rows, []any{&id, &token, &attempt, &iteration, raw(&st.Input), raw(&st.Context),
		raw(&st.Rules), raw(&st.Deps), raw(&st.Element), &index}, func() error {
		if token != nil && attempt != nil && iteration != nil {
			st.Token, st.Attempt, st.Iteration, st.Index = *token, *attempt, *iteration, elementIndex(index)
			started[id] = st
		}
		st = Started{}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: start %d steps: %w", len(stepIDs), err)
	}
	return started, nil
}

// CompleteSteps records a batch of successful attempts (stepready.complete_steps); entry i is step stepIDs[i],
// fencing token tokens[i], output outputs[i]. It returns, per step id, whether its entry was recorded (false:
// fenced out). A collect error of one entry fails the whole call.
func CompleteSteps(ctx context.Context, db DBTX, stepIDs []int64, tokens []int, outputs []json.RawMessage) (map[int64]bool, error) {
	if len(tokens) != len(stepIDs) || len(outputs) != len(stepIDs) {
		return nil, fmt.Errorf("store: complete steps: %d ids, %d tokens, %d outputs", len(stepIDs), len(tokens),
			len(outputs))
	}
	docs := make([]string, len(outputs))
	for i, o := range outputs {
		docs[i] = string(o)
	}
	rows, err := db.Query(ctx, `SELECT step_id, completed FROM stepready.complete_steps($1, $2, $3::jsonb[])`,
		stepIDs, tokens, docs)
	if err != nil {
		return nil, fmt.Errorf("store: complete %d steps: %w", len(stepIDs), err)
	}
	done := make(map[int64]bool, len(stepIDs))
	var id int64
	var ok bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &ok}, func() error { done[id] = ok; return nil }); err != nil {
		return nil, fmt.Errorf("store: complete %d steps: %w", len(stepIDs), err)
	}
	return done, nil
}

// Completion is one successful attempt for RecordOutcomes: Token is its fencing token (Started.Token).
type Completion struct {
	StepID int64
	Token  int
	Output json.RawMessage
}

// Failure is one failed attempt for RecordOutcomes: Token is its fencing token, ErrorDoc fail_step's p_error.
type Failure struct {
	StepID   int64
	Token    int
	ErrorDoc json.RawMessage
}

// RecordOutcomes records a batch of successes (complete_steps) and of failures (fail_steps) in one round trip and
// one transaction. It returns, per step id, whether each completion was recorded (false: fenced out) and what
// fail_steps decided for each failure. Any error (one entry the database refuses fails the whole call) leaves
// nothing recorded.
func RecordOutcomes(ctx context.Context, db interface {
	DBTX
	BatchSender
}, completions []Completion, failures []Failure) (map[int64]bool, map[int64]FailResult, error) {
	b := &pgx.Batch{}
	done := make(map[int64]bool, len(completions))
	failed := make(map[int64]FailResult, len(failures))
	// One kind only is the common case: send it as a plain statement (a pipelined batch costs more on both sides).
	both := len(completions) > 0 && len(failures) > 0
	send := func(what, query string, scan func(pgx.Rows) error, args ...any) error {
		if both {
			b.Queue(query, args...).Query(scan)
			return nil
		}
		rows, err := db.Query(ctx, query, args...)
		if err == nil {
			err = scan(rows)
		}
		if err != nil {
			return fmt.Errorf("store: %s: %w", what, err)
		}
		return nil
	}
	if len(completions) > 0 {
		ids := make([]int64, len(completions))
		tokens := make([]int, len(completions))
		outputs := make([]string, len(completions))
		for i, c := range completions {
			ids[i], tokens[i], outputs[i] = c.StepID, c.Token, string(c.Output)
		}
		err := send(fmt.Sprintf("complete %d steps", len(ids)),
			`SELECT step_id, completed FROM stepready.complete_steps($1, $2, $3::jsonb[])`,
			func(rows pgx.Rows) error {
				var id int64
				var ok bool
				_, err := pgx.ForEachRow(rows, []any{&id, &ok}, func() error { done[id] = ok; return nil })
				return err
			}, ids, tokens, outputs)
		if err != nil {
			return nil, nil, err
		}
	}
	if len(failures) > 0 {
		ids := make([]int64, len(failures))
		tokens := make([]int, len(failures))
		docs := make([]string, len(failures))
		for i, f := range failures {
			ids[i], tokens[i], docs[i] = f.StepID, f.Token, string(f.ErrorDoc)
		}
		err := send(fmt.Sprintf("fail %d steps", len(ids)),
			`SELECT step_id, state, next_attempt_at, reason FROM stepready.fail_steps($1, $2, $3::jsonb[])`,
			func(rows pgx.Rows) error {
				var id int64
				var state *string
				var r FailResult
				_, err := pgx.ForEachRow(rows, []any{&id, &state, &r.NextAttemptAt, &r.Reason}, func() error {
					if state != nil {
						r.State = *state
					}
					failed[id] = r
					r = FailResult{}
					return nil
				})
				return err
			}, ids, tokens, docs)
		if err != nil {
			return nil, nil, err
		}
	}
	if b.Len() == 0 {
		return done, failed, nil
	}
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, fmt.Errorf("store: record %d completions and %d failures: %w", len(completions),
			len(failures), err)
	}
	return done, failed, nil
}

// HeartbeatStep extends the lease of the running attempt whose fencing token is token; false when that attempt is
// no longer the running one (cancelled, resolved, reaped, reset): the worker must then stop its handler.
func HeartbeatStep(ctx context.Context, db DBTX, stepID int64, token int, lease time.Duration) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, `SELECT stepready.heartbeat_step($1, $2, $3)`, stepID, token, ms(lease)).Scan(&ok); err != nil {
		return false, fmt.Errorf("store: heartbeat step %d token %d: %w", stepID, token, err)
	}
	return ok, nil
}

// CompleteStep records a successful attempt (token: its fencing token); false when the attempt was fenced out.
func CompleteStep(ctx context.Context, db DBTX, stepID int64, token int, output json.RawMessage) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, `SELECT stepready.complete_step($1, $2, $3)`, stepID, token, output).Scan(&ok); err != nil {
		return false, fmt.Errorf("store: complete step %d token %d: %w", stepID, token, err)
	}
	return ok, nil
}

// FailResult is what stepready.fail_step decided.
type FailResult struct {
	// State is the step's state after the failure (waiting_for_retry, error, skipped), or its current state when
	// the attempt was fenced out.
	State string
	// NextAttemptAt is when the retry may start (waiting_for_retry only).
	NextAttemptAt *time.Time
	// Reason is NULL for a scheduled retry, else not_retryable, circuit_open, retries_exhausted or stale_attempt.
	Reason *string
}

// Stale reports whether the attempt had been fenced out and nothing was recorded.
func (r FailResult) Stale() bool { return r.Reason != nil && *r.Reason == "stale_attempt" }

// FailStep records a failed attempt (token: its fencing token) with the error document of SPEC §6 ({class,
// message, code, …}).
func FailStep(ctx context.Context, db DBTX, stepID int64, token int, errorDoc json.RawMessage) (FailResult, error) {
	var r FailResult
	var state *string
	err := db.QueryRow(ctx, `SELECT state, next_attempt_at, reason FROM stepready.fail_step($1, $2, $3)`,
		stepID, token, errorDoc).Scan(&state, &r.NextAttemptAt, &r.Reason)
	if err != nil {
		return FailResult{}, fmt.Errorf("store: fail step %d token %d: %w", stepID, token, err)
	}
	if state != nil {
		r.State = *state
	}
	return r, nil
}

// FailClaimed fails a claimed step that cannot be handed to a worker (its row breaks a bound, River refused its
// job): it starts the attempt (start_step returns its fencing token) and records it failed with errorDoc at once,
// in one statement, so that the step ends
// like any failed attempt (events, on_exhausted) within the caller's transaction, usually the claim's. A step that
// start_step does not let run (its task was paused meanwhile) is handed back instead, and the result says
// stale_attempt.
func FailClaimed(ctx context.Context, db DBTX, stepID int64, worker string, lease time.Duration,
	errorDoc json.RawMessage) (FailResult, error) {
	var r FailResult
	var state *string
	err := db.QueryRow(ctx, `SELECT f.state, f.next_attempt_at, f.reason
		FROM stepready.fail_step($1, stepready.start_step($1, $2, $3), $4) f`,
		stepID, worker, ms(lease), errorDoc).Scan(&state, &r.NextAttemptAt, &r.Reason)
	if err != nil {
		return FailResult{}, fmt.Errorf("store: fail claimed step %d: %w", stepID, err)
	}
	if state != nil {
		r.State = *state
	}
	return r, nil
}

// ContinueStep records a successful iteration (token: the attempt's fencing token) and schedules the next one;
// false when fenced out.
func ContinueStep(ctx context.Context, db DBTX, stepID int64, token int, output, nextInput json.RawMessage,
	delay time.Duration) (bool, error) {
	var ok bool
	if delay < 0 {
		delay = 0
	}
	if err := db.QueryRow(ctx, `SELECT stepready.continue_step($1, $2, $3, $4, $5)`,
		stepID, token, output, nextInput, ms(delay)).Scan(&ok); err != nil {
		return false, fmt.Errorf("store: continue step %d token %d: %w", stepID, token, err)
	}
	return ok, nil
}

// ReleaseStep hands an attempt back uncharged (shutdown); token is the attempt's fencing token. token nil releases
// a step claimed but never started.
func ReleaseStep(ctx context.Context, db DBTX, stepID int64, token *int) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, `SELECT stepready.release_step($1, $2)`, stepID, token).Scan(&ok); err != nil {
		return false, fmt.Errorf("store: release step %d: %w", stepID, err)
	}
	return ok, nil
}

// ReapExpiredLeases runs reap_expired_leases once on at most limit expired leases; it returns how many steps it
// handled.
func ReapExpiredLeases(ctx context.Context, db DBTX, limit int) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT stepready.reap_expired_leases(now(), $1)`, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: reap expired leases: %w", err)
	}
	return n, nil
}

// ReadNextDue reads what claimWithNextDue reads before a claim, without claiming: for a poller with no capacity to
// claim.
func ReadNextDue(ctx context.Context, db DBTX) (NextDue, error) {
	var due NextDue
	var at pgtype.Timestamptz
	if err := db.QueryRow(ctx, nextDueSQL).Scan(&at, &due.DBNow, &due.Wakeups, &due.XMax); err != nil {
		return NextDue{}, fmt.Errorf("store: next claim time: %w", err)
	}
	due.At = finiteTime(at)
	return due, nil
}

// WakeProbe is one reading of the wake-up counter with the transaction horizon.
type WakeProbe struct {
	// Count is wake_count (sql/045_notify.sql): it moves whenever a transaction makes a step claimable now,
	// before that transaction commits.
	Count int64
	// XMin is the oldest transaction still running (xmin of a snapshot), XMax the first not yet started: once
	// XMin reaches the XMax read when the counter moved, every transaction that moved it has ended.
	XMin, XMax int64
}

// ReadWakeProbe reads the wake-up counter and the transaction horizon: one read of a sequence's page and a
// snapshot, cheap enough to probe every few tens of milliseconds.
func ReadWakeProbe(ctx context.Context, db DBTX) (WakeProbe, error) {
	var p WakeProbe
	if err := db.QueryRow(ctx, `SELECT stepready.wake_count(), pg_catalog.pg_snapshot_xmin(s)::text::bigint,
		pg_catalog.pg_snapshot_xmax(s)::text::bigint FROM pg_catalog.pg_current_snapshot() AS s`).Scan(
		&p.Count, &p.XMin, &p.XMax); err != nil {
		return WakeProbe{}, fmt.Errorf("store: wake probe: %w", err)
	}
	return p, nil
}

// WakeDaemons calls wake_daemons (sql/045_notify.sql): a NOTIFY on stepready_ready in a transaction of its own
// whose commit does not wait for the WAL flush. Call it on a pool or a connection outside a transaction, after
// the commit of what it announces.
func WakeDaemons(ctx context.Context, db DBTX, taskID int64) error {
	if _, err := db.Exec(ctx, `SELECT stepready.wake_daemons($1)`, taskID); err != nil {
		return fmt.Errorf("store: wake the daemons: %w", err)
	}
	return nil
}

// NextClaimAt returns when the next claimable step becomes due (nil: none is waiting on a backoff), and the
// database's clock now, so a caller can set a timer without trusting its own clock.
func NextClaimAt(ctx context.Context, db DBTX) (next *time.Time, dbNow time.Time, err error) {
	// See ClaimAndStartStepsNextDue for the same read together with a claim.
	var at pgtype.Timestamptz
	if err := db.QueryRow(ctx, `SELECT stepready.next_claim_at(), now()`).Scan(&at, &dbNow); err != nil {
		return nil, time.Time{}, fmt.Errorf("store: next claim time: %w", err)
	}
	return finiteTime(at), dbNow, nil
}

// RecordPolicyEvaluation appends the policy.evaluated event of a running attempt (token: its fencing token; what
// its rules decided); false when the attempt was fenced out.
func RecordPolicyEvaluation(ctx context.Context, db DBTX, stepID int64, token int, details json.RawMessage) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, `SELECT stepready.record_policy_evaluation($1, $2, $3)`, stepID, token, details).Scan(&ok); err != nil {
		return false, fmt.Errorf("store: record policy evaluation of step %d token %d: %w", stepID, token, err)
	}
	return ok, nil
}

// SQLState returns the SQLSTATE of a PostgreSQL error, or "" for any other error.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// PruneTasks calls prune_tasks (SPEC §13): it deletes at most limit tasks whose status is in statuses and that
// finished before finishedBefore, with their steps, edges and events, and returns how many it deleted.
func PruneTasks(ctx context.Context, db DBTX, finishedBefore time.Time, statuses []string, limit int) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT stepready.prune_tasks($1, $2, $3)`, finishedBefore, statuses, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: prune tasks: %w", err)
	}
	return n, nil
}

// CountPrunable counts the tasks prune_tasks would delete for the same cut-off and statuses, with no limit and
// without deleting or locking anything (scheduler prune --dry-run).
func CountPrunable(ctx context.Context, db DBTX, finishedBefore time.Time, statuses []string) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks
		WHERE completed_at < $1 AND status = ANY ($2)`, finishedBefore, statuses).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count prunable tasks: %w", err)
	}
	return n, nil
}

// QueueStat is one row of queue_stats: the backlog of one queue.
type QueueStat struct {
	Queue string `json:"queue"`
	// Ready is how many steps could be claimed now.
	Ready int64 `json:"ready"`
	// InFlight is how many steps hold a slot: claimed or running, or moved out of flight by an operator while
	// their attempt may still run (an orphaned lease not expired). Always exact.
	InFlight int64 `json:"in_flight"`
	// WaitingForRetry is how many steps wait out a retry backoff.
	WaitingForRetry int64 `json:"waiting_for_retry"`
	// DueWithinMinute is how many steps not ready yet become due within a minute.
	DueWithinMinute int64 `json:"due_within_minute"`
	// OldestReadySeconds is how long the oldest ready step has waited to be claimed (0: none ready).
	OldestReadySeconds float64 `json:"oldest_ready_seconds"`
	// Estimated says that Ready, WaitingForRetry, DueWithinMinute and OldestReadySeconds are estimates from a
	// sample of the table: there were more claimable steps than queue_stats counts exactly (10,000, the SQL
	// function stepready._read_budget). The oldest wait is then the oldest among the rows sampled, so the true
	// lag may be longer. Show them as approximate ("~").
	Estimated bool `json:"estimated"`
}

// QueueStats calls queue_stats: per queue, ready, in flight, waiting for retry, due within a minute and the
// scheduling lag, read through the claim and lease indexes, estimated from a bounded sample above 10,000
// claimable steps (Estimated).
func QueueStats(ctx context.Context, db DBTX) ([]QueueStat, error) {
	rows, err := db.Query(ctx, `SELECT queue, ready, in_flight, waiting_for_retry, due_within_minute,
		COALESCE(oldest_ready_seconds, 0), estimated FROM stepready.queue_stats()`)
	if err != nil {
		return nil, fmt.Errorf("store: queue stats: %w", err)
	}
	stats, err := pgx.CollectRows(rows, pgx.RowToStructByPos[QueueStat])
	if err != nil {
		return nil, fmt.Errorf("store: queue stats: %w", err)
	}
	return stats, nil
}

// MapStats is the progress of the maps running now (stepready.map_stats): map steps in progress that have fanned
// out, their elements, and of those the ones done, failed and in flight.
type MapStats struct {
	Maps, Elements, Done, Failed, InFlight int64
}

// SignalStats is waiting for the world at a glance (stepready.signal_stats, SPEC §20): the steps waiting now by
// reason, and the signals of the tasks in the database: received, delivered (consumed by a step) and buffered
// (not consumed yet).
type SignalStats struct {
	WaitingForSignal, Sleeping, Received, Delivered, Buffered int64
}

// ReadSignalStats reads stepready.signal_stats().
func ReadSignalStats(ctx context.Context, db DBTX) (SignalStats, error) {
	var s SignalStats
	if err := db.QueryRow(ctx, `SELECT waiting_for_signal, sleeping, received, delivered, buffered
		FROM stepready.signal_stats()`).Scan(&s.WaitingForSignal, &s.Sleeping, &s.Received, &s.Delivered, &s.Buffered); err != nil {
		return s, fmt.Errorf("store: signal stats: %w", err)
	}
	return s, nil
}

// ReadMapStats reads stepready.map_stats().
func ReadMapStats(ctx context.Context, db DBTX) (MapStats, error) {
	var s MapStats
	if err := db.QueryRow(ctx, `SELECT maps, elements, done, failed, in_flight FROM stepready.map_stats()`).Scan(
		&s.Maps, &s.Elements, &s.Done, &s.Failed, &s.InFlight); err != nil {
		return s, fmt.Errorf("store: map stats: %w", err)
	}
	return s, nil
}
