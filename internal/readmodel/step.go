package readmodel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// StepDetail is everything a step's page shows, read in one snapshot.
type StepDetail struct {
	Step
	TaskID        int64           `json:"task_id"`
	Input         json.RawMessage `json:"input"`
	Output        json.RawMessage `json:"output"`
	Iteration     int32           `json:"iteration"`
	MaxIterations *int32          `json:"max_iterations"`
	TimeoutMS     *int64          `json:"timeout_ms"`
	Priority      int32           `json:"priority"`
	RetryPolicy   *string         `json:"retry_policy"`
	// Deps is what the step's next attempt would receive as deps now (SPEC §18): its direct parents' outputs by
	// name, those that are complete or resolved.
	Deps json.RawMessage `json:"deps"`
	// ResolvedInput is the input with its references resolved against Deps and the task's context now (equal to
	// Input when it has none); nil when it does not resolve yet, and InputProblem says why.
	ResolvedInput json.RawMessage `json:"resolved_input"`
	// InputProblem is why the input does not resolve now (a parent not finished yet, a path that names nothing).
	InputProblem *string   `json:"input_problem,omitempty"`
	AsOf         time.Time `json:"as_of"`
	// Reasons are every reason the step may not start now, in precedence order (when it is ready: its wait for a
	// worker, waiting_for_worker).
	Reasons  []Reason  `json:"reasons"`
	Attempts []Attempt `json:"attempts"`
	// Events are the step's newest events (at most StepEventsLimit), newest first.
	Events []Event `json:"events"`
}

// StepEventsLimit is how many of a step's events ReadStep returns.
const StepEventsLimit = 200

// ReadStep reads step stepID of task taskID in one snapshot at asOf (nil: the database's now). A step that does
// not exist, or belongs to another task, is an error wrapping ErrNotFound.
func ReadStep(ctx context.Context, db Beginner, taskID, stepID int64, asOf *time.Time) (*StepDetail, error) {
	d := &StepDetail{}
	err := Snapshot(ctx, db, func(tx pgx.Tx) error {
		var err error
		if d.AsOf, err = Now(ctx, tx, asOf); err != nil {
			return err
		}
		err = tx.QueryRow(ctx, query("step"), taskID, stepID).Scan(&d.TaskID, &d.Input, &d.Output, &d.Iteration,
			&d.MaxIterations, &d.TimeoutMS, &d.Priority, &d.RetryPolicy, &d.Deps, &d.ResolvedInput, &d.InputProblem)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFoundf("task %d has no step %d", taskID, stepID)
		}
		if err != nil {
			return fmt.Errorf("readmodel: step: %w", err)
		}
		t, err := readTaskSteps(ctx, tx, taskID, []int64{stepID}, &d.AsOf)
		if err != nil {
			return err
		}
		if len(t.StepList) != 1 {
			return notFoundf("task %d has no step %d", taskID, stepID)
		}
		d.Step = t.StepList[0]
		if d.Reasons, err = reasons(ctx, tx, "reasons_step", stepID, d.AsOf); err != nil {
			return err
		}
		if d.Attempts, err = collect(ctx, tx, "attempts", scanAttempt, taskID, stepID); err != nil {
			return err
		}
		d.Events, _, err = eventsPage(ctx, tx, taskID, stepID, 0, StepEventsLimit)
		return err
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// StepID returns the id of the step named name in task taskID (an error wrapping ErrNotFound if none).
func StepID(ctx context.Context, q Querier, taskID int64, name string) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, query("step_by_name"), taskID, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, notFoundf("task %d has no step %q", taskID, name)
	}
	if err != nil {
		return 0, fmt.Errorf("readmodel: step by name: %w", err)
	}
	return id, nil
}

// StepTask returns the task of step stepID (an error wrapping ErrNotFound if the step does not exist).
func StepTask(ctx context.Context, q Querier, stepID int64) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, query("step_task"), stepID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, notFoundf("step %d does not exist", stepID)
	}
	if err != nil {
		return 0, fmt.Errorf("readmodel: step task: %w", err)
	}
	return id, nil
}
