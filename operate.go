package stepready

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepready/stepready/internal/store"
)

// The operator functions (docs/functions.md) as library calls: the CLI (`scheduler task cancel`, …) and the web console's
// actions are thin faces over them. Each runs in one transaction that reads the row before and after the SQL
// operator function, names the actor of its operator.* event (details.actor) for that transaction only, and
// returns what changed. A refusal (an impossible transition, an unknown id) is the database's own message.

// Beginner is what an operator action needs: DBTX that can open a transaction (*pgxpool.Pool, *pgx.Conn; a
// pgx.Tx opens a savepoint, so an action can join the caller's transaction).
type Beginner interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ErrNotFound is what errors.Is finds in the error of an operator action whose task or step does not exist, or of
// a creation from a template that does not exist (the error's message says which: "task 12 does not exist",
// `template "nightly" does not exist`).
var ErrNotFound = errors.New("stepready: not found")

// notFoundError keeps the store's message ("task 12 does not exist") and is ErrNotFound.
type notFoundError struct{ err error }

func (e notFoundError) Error() string        { return e.err.Error() }
func (e notFoundError) Unwrap() error        { return e.err }
func (e notFoundError) Is(target error) bool { return target == ErrNotFound }

// public maps the store's not-found errors to ErrNotFound.
func public(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return notFoundError{err}
	}
	return err
}

// ActorDefault is the actor recorded when OperatorOptions.Actor is empty.
const ActorDefault = "library"

// OperatorOptions are the options of an operator action.
type OperatorOptions struct {
	// Actor names who acts, recorded as details.actor of the operator.* event ("cli", "ui", a user's name…;
	// default ActorDefault).
	Actor string
}

// TaskChange is what a task action did: the task's status and pause flag before and after.
type TaskChange struct {
	TaskID int64 `json:"task_id"`
	// Action is cancel, pause, resume or reset.
	Action string `json:"action"`
	// Changed is false when nothing changed (pausing a paused task, resuming one that was not paused).
	Changed bool `json:"changed"`
	// StepsAffected is how many steps cancel or reset changed (nil for pause and resume).
	StepsAffected  *int32 `json:"steps_affected,omitempty"`
	PreviousStatus string `json:"previous_status"`
	Status         string `json:"status"`
	PreviousPaused bool   `json:"previous_paused"`
	Paused         bool   `json:"paused"`
}

// StepChange is what a step action did: the step's state, backoff and retry budget before and after.
type StepChange struct {
	StepID int64  `json:"step_id"`
	TaskID int64  `json:"task_id"`
	Name   string `json:"name"`
	// Action is retry or resolve.
	Action                string     `json:"action"`
	PreviousState         string     `json:"previous_state"`
	State                 string     `json:"state"`
	PreviousNextAttemptAt *time.Time `json:"previous_next_attempt_at"`
	NextAttemptAt         *time.Time `json:"next_attempt_at"`
	Attempts              int32      `json:"attempts"`
	PreviousMaxAttempts   *int32     `json:"previous_max_attempts"`
	MaxAttempts           *int32     `json:"max_attempts"`
	// Output is the step's output after resolve (nil for retry).
	Output     json.RawMessage `json:"output,omitempty"`
	TaskStatus string          `json:"task_status"`
}

// CancelTask cancels task id (cancel_task): every step not finished becomes cancelled, a running attempt is
// fenced out. reason ("" for none) is recorded in the operator.cancel event.
func CancelTask(ctx context.Context, db Beginner, id int64, reason string, opts OperatorOptions) (*TaskChange, error) {
	return taskAction(ctx, db, id, "cancel", opts, func(tx pgx.Tx) (*int32, bool, error) {
		var r *string
		if reason != "" {
			r = &reason
		}
		n, err := store.CancelTask(ctx, tx, id, r)
		return &n, true, err
	})
}

// PauseTask pauses task id (pause_task): none of its steps is claimed or started until ResumeTask.
func PauseTask(ctx context.Context, db Beginner, id int64, opts OperatorOptions) (*TaskChange, error) {
	return taskAction(ctx, db, id, "pause", opts, func(tx pgx.Tx) (*int32, bool, error) {
		changed, err := store.PauseTask(ctx, tx, id)
		return nil, changed, err
	})
}

// ResumeTask resumes a paused task id (resume_task).
func ResumeTask(ctx context.Context, db Beginner, id int64, opts OperatorOptions) (*TaskChange, error) {
	return taskAction(ctx, db, id, "resume", opts, func(tx pgx.Tx) (*int32, bool, error) {
		changed, err := store.ResumeTask(ctx, tx, id)
		return nil, changed, err
	})
}

// ResetTask resumes task id from failure (reset_task): its error, skipped and cancelled steps go back to pending
// with a fresh retry budget.
func ResetTask(ctx context.Context, db Beginner, id int64, opts OperatorOptions) (*TaskChange, error) {
	return taskAction(ctx, db, id, "reset", opts, func(tx pgx.Tx) (*int32, bool, error) {
		n, err := store.ResetTask(ctx, tx, id)
		return &n, n > 0, err
	})
}

// RetryStepNow retries step id now (retry_step_now): a waiting step loses its backoff, a step in error gets
// exactly one more attempt.
func RetryStepNow(ctx context.Context, db Beginner, id int64, opts OperatorOptions) (*StepChange, error) {
	return stepAction(ctx, db, id, "retry", opts, func(tx pgx.Tx) error {
		_, err := store.RetryStepNow(ctx, tx, id)
		return err
	})
}

// ResolveStep resolves step id by hand with output (resolve_step): it becomes resolved_manually and its
// dependents proceed as if it had completed.
func ResolveStep(ctx context.Context, db Beginner, id int64, output json.RawMessage, opts OperatorOptions) (*StepChange, error) {
	if !json.Valid(output) {
		return nil, fmt.Errorf("%w: output: not a JSON document", ErrInvalidDefinition)
	}
	return stepAction(ctx, db, id, "resolve", opts, func(tx pgx.Tx) error {
		_, err := store.ResolveStep(ctx, tx, id, output)
		return err
	})
}

// operatorTx runs f in a transaction of db that names the actor. Once it committed (db not a transaction of
// the caller's), the daemons are woken: resume, reset, retry and resolve may ready steps (cancel and pause
// wake them for nothing, which costs them a claim).
func operatorTx(ctx context.Context, db Beginner, opts OperatorOptions, f func(tx pgx.Tx) error) error {
	actor := opts.Actor
	if actor == "" {
		actor = ActorDefault
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := store.NameActor(ctx, tx, actor); err != nil {
			return err
		}
		return f(tx)
	})
	if err == nil {
		wakeAfter(ctx, db, 0)
	}
	return err
}

func taskAction(ctx context.Context, db Beginner, id int64, action string, opts OperatorOptions,
	call func(pgx.Tx) (*int32, bool, error)) (*TaskChange, error) {
	ch := &TaskChange{TaskID: id, Action: action}
	err := operatorTx(ctx, db, opts, func(tx pgx.Tx) error {
		before, err := store.ReadTaskState(ctx, tx, id)
		if err != nil {
			return public(err)
		}
		if ch.StepsAffected, ch.Changed, err = call(tx); err != nil {
			return err
		}
		after, err := store.ReadTaskState(ctx, tx, id)
		ch.PreviousStatus, ch.PreviousPaused, ch.Status, ch.Paused = before.Status, before.Paused, after.Status, after.Paused
		return err
	})
	if err != nil {
		return nil, err
	}
	return ch, nil
}

func stepAction(ctx context.Context, db Beginner, id int64, action string, opts OperatorOptions,
	call func(pgx.Tx) error) (*StepChange, error) {
	ch := &StepChange{StepID: id, Action: action}
	err := operatorTx(ctx, db, opts, func(tx pgx.Tx) error {
		before, err := store.ReadStepState(ctx, tx, id)
		if err != nil {
			return public(err)
		}
		if err := call(tx); err != nil {
			return err
		}
		after, err := store.ReadStepState(ctx, tx, id)
		if err != nil {
			return err
		}
		ch.TaskID, ch.Name, ch.State, ch.NextAttemptAt, ch.Attempts, ch.MaxAttempts, ch.TaskStatus =
			after.TaskID, after.Name, after.State, after.NextAttemptAt, after.Attempts, after.MaxAttempts, after.TaskStatus
		ch.PreviousState, ch.PreviousNextAttemptAt, ch.PreviousMaxAttempts = before.State, before.NextAttemptAt,
			before.MaxAttempts
		if action == "resolve" {
			ch.Output = after.Output
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ch, nil
}
