package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The operator functions of SPEC §9, and the rows their callers show before and after. Each call runs in the
// caller's transaction; NameActor names who acts.

// ErrNotFound is what errors.Is finds in the error of a call whose task or step does not exist; the error's own
// message says which ("task 12 does not exist").
var ErrNotFound = errors.New("not found")

// notFoundError says what does not exist, and is ErrNotFound.
type notFoundError struct{ msg string }

func (e notFoundError) Error() string        { return e.msg }
func (e notFoundError) Is(target error) bool { return target == ErrNotFound }

// TaskState is what an operator action changes on a task.
type TaskState struct {
	Status string
	Paused bool
}

// ReadTaskState reads task id's status and pause flag (an error wrapping ErrTaskNotFound if it does not exist).
func ReadTaskState(ctx context.Context, db DBTX, id int64) (TaskState, error) {
	var s TaskState
	err := db.QueryRow(ctx, `SELECT status, paused FROM stepready.tasks WHERE id = $1`, id).Scan(&s.Status, &s.Paused)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, notFoundError{fmt.Sprintf("task %d does not exist", id)}
	}
	if err != nil {
		return s, fmt.Errorf("store: read task %d: %w", id, err)
	}
	return s, nil
}

// StepState is what an operator action changes on a step.
type StepState struct {
	TaskID        int64
	Name          string
	State         string
	NextAttemptAt *time.Time
	Attempts      int32
	MaxAttempts   *int32
	Output        json.RawMessage
	TaskStatus    string
}

// ReadStepState reads step id with its task's status (an error wrapping ErrStepNotFound if it does not exist).
func ReadStepState(ctx context.Context, db DBTX, id int64) (StepState, error) {
	var s StepState
	err := db.QueryRow(ctx, `SELECT s.task_id, s.name, s.state, s.next_attempt_at, s.attempts, s.max_attempts,
			s.output, t.status
		FROM stepready.steps s JOIN stepready.tasks t ON t.id = s.task_id WHERE s.id = $1`, id).
		Scan(&s.TaskID, &s.Name, &s.State, &s.NextAttemptAt, &s.Attempts, &s.MaxAttempts, raw(&s.Output), &s.TaskStatus)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, notFoundError{fmt.Sprintf("step %d does not exist", id)}
	}
	if err != nil {
		return s, fmt.Errorf("store: read step %d: %w", id, err)
	}
	return s, nil
}

// CancelTask calls cancel_task; it returns how many steps it cancelled. reason nil records none.
func CancelTask(ctx context.Context, db DBTX, id int64, reason *string) (int32, error) {
	var n int32
	err := db.QueryRow(ctx, `SELECT stepready.cancel_task($1, $2)`, id, reason).Scan(&n)
	return n, err
}

// PauseTask calls pause_task; false: it was paused already.
func PauseTask(ctx context.Context, db DBTX, id int64) (bool, error) {
	var changed bool
	err := db.QueryRow(ctx, `SELECT stepready.pause_task($1)`, id).Scan(&changed)
	return changed, err
}

// ResumeTask calls resume_task; false: it was not paused.
func ResumeTask(ctx context.Context, db DBTX, id int64) (bool, error) {
	var changed bool
	err := db.QueryRow(ctx, `SELECT stepready.resume_task($1)`, id).Scan(&changed)
	return changed, err
}

// ResetTask calls reset_task; it returns how many steps went back to pending.
func ResetTask(ctx context.Context, db DBTX, id int64) (int32, error) {
	var n int32
	err := db.QueryRow(ctx, `SELECT stepready.reset_task($1)`, id).Scan(&n)
	return n, err
}

// RetryStepNow calls retry_step_now.
func RetryStepNow(ctx context.Context, db DBTX, id int64) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `SELECT stepready.retry_step_now($1)`, id).Scan(&ok)
	return ok, err
}

// ResolveStep calls resolve_step with output.
func ResolveStep(ctx context.Context, db DBTX, id int64, output json.RawMessage) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `SELECT stepready.resolve_step($1, $2::jsonb)`, id, string(output)).Scan(&ok)
	return ok, err
}

// CheckExecute returns an error naming the function and the roles that grant it when the current user may not
// execute fn (a regprocedure signature such as "stepready.prune_tasks(timestamptz, text[], int)"): a dry run
// checks the privileges of the real run this way.
func CheckExecute(ctx context.Context, db DBTX, fn string) error {
	var ok bool
	var grantees []string
	err := db.QueryRow(ctx, `SELECT has_function_privilege(current_user, $1::regprocedure, 'EXECUTE'),
			ARRAY(SELECT r.rolname FROM pg_catalog.pg_roles r
			       WHERE r.rolname IN ('stepready_client', 'stepready_worker', 'stepready_operator', 'stepready_reader')
			         AND has_function_privilege(r.oid, $1::regprocedure, 'EXECUTE')
			       ORDER BY 1)`, fn).Scan(&ok, &grantees)
	if err != nil {
		return fmt.Errorf("store: check the privilege to execute %s: %w", fn, err)
	}
	if !ok {
		return fmt.Errorf("permission denied for function %s: grant one of %v to this role", fn, grantees)
	}
	return nil
}

// deniedObject finds the object PostgreSQL named in a permission error ("permission denied for function
// cancel_task"). The message is read only to name the object back to the user; the error is matched by SQLSTATE.
var deniedObject = regexp.MustCompile(`permission denied for (function|procedure|table|relation|sequence|schema) "?([\w.]+)"?`)

// NameGrantingRoles adds to a permission error (SQLSTATE 42501) of a stepready object the stepready roles that
// grant it ("… cancel_task: grant one of [stepready_operator] to this role"), read with db (not the failed
// transaction). Any other error, or one whose object it cannot find, is returned as it is.
func NameGrantingRoles(ctx context.Context, db DBTX, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		return err
	}
	m := deniedObject.FindStringSubmatch(pgErr.Message)
	if m == nil {
		return err
	}
	kind, name := m[1], m[2]
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	var roles []string
	var q string
	switch kind {
	case "function", "procedure":
		q = `SELECT ARRAY(SELECT DISTINCT r.rolname FROM pg_catalog.pg_roles r, pg_catalog.pg_proc p
			WHERE p.pronamespace = 'stepready'::regnamespace AND p.proname = $1
			  AND r.rolname IN ('stepready_client', 'stepready_worker', 'stepready_operator', 'stepready_reader')
			  AND has_function_privilege(r.oid, p.oid, 'EXECUTE') ORDER BY 1)`
	case "table", "relation":
		q = `SELECT ARRAY(SELECT DISTINCT r.rolname FROM pg_catalog.pg_roles r, pg_catalog.pg_class c
			WHERE c.relnamespace = 'stepready'::regnamespace AND c.relname = $1
			  AND r.rolname IN ('stepready_client', 'stepready_worker', 'stepready_operator', 'stepready_reader')
			  AND has_table_privilege(r.oid, c.oid, 'SELECT, INSERT, UPDATE, DELETE') ORDER BY 1)`
	default:
		return err
	}
	if qerr := db.QueryRow(ctx, q, name).Scan(&roles); qerr != nil || len(roles) == 0 {
		return err
	}
	return &deniedError{err: err, msg: fmt.Sprintf("%s: grant one of %v to this role", pgErr.Message, roles)}
}

// deniedError is a permission error with the roles that grant what was denied.
type deniedError struct {
	err error
	msg string
}

func (e *deniedError) Error() string { return e.msg }
func (e *deniedError) Unwrap() error { return e.err }
