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
	InputProblem *string `json:"input_problem,omitempty"`
	// Wait is a wait step's wait as defined (SPEC §20: {signal, timeout_ms, on_timeout}, {duration_ms} or
	// {until}); nil for a step run by a handler.
	Wait json.RawMessage `json:"wait,omitempty"`
	// WaitUntil is, while the step is waiting, when its sleep ends or its signal wait times out (nil: it waits for
	// a signal without a timeout, or it is not waiting).
	WaitUntil *time.Time `json:"wait_until,omitempty"`
	// Signals are, of a wait step, its task's mailbox (every signal of the task, oldest first: what each step
	// waits for and what it got); nil for a step run by a handler.
	Signals []Signal  `json:"signals,omitempty"`
	AsOf    time.Time `json:"as_of"`
	// Reasons are every reason the step may not start now, in precedence order (when it is ready: its wait for a
	// worker, waiting_for_worker).
	Reasons  []Reason  `json:"reasons"`
	Attempts []Attempt `json:"attempts"`
	// Events are the step's newest events (at most StepEventsLimit), newest first.
	Events []Event `json:"events"`
	// Elements are a page of a map step's elements in element order (nil for any other step); MoreElements says
	// that more follow (read them with StepOptions.ElementsAfter = the last one's Index).
	Elements     []Element `json:"elements,omitempty"`
	MoreElements bool      `json:"more_elements,omitempty"`
}

// Element is one element of a map step (SPEC §19), as a map step's element list shows it.
type Element struct {
	ID          int64           `json:"id"`
	Name        string          `json:"name"`
	Index       int32           `json:"element_index"`
	State       string          `json:"state"`
	Attempts    int32           `json:"attempts"`
	MaxAttempts *int32          `json:"max_attempts"`
	LastError   json.RawMessage `json:"last_error"`
	Output      json.RawMessage `json:"output"`
}

// StepOptions says how ReadStepPage reads a step.
type StepOptions struct {
	// AsOf pins the instant readiness is computed for (nil: the database's now).
	AsOf *time.Time
	// ElementsAfter and ElementsLimit choose the page of a map step's elements: those with an index above
	// ElementsAfter (-1: from the first), at most ElementsLimit (0: DefaultElementsLimit).
	ElementsAfter int32
	ElementsLimit int
}

// DefaultElementsLimit is how many elements of a map step a page holds unless StepOptions says otherwise.
const DefaultElementsLimit = 50

// StepEventsLimit is how many of a step's events ReadStep returns.
const StepEventsLimit = 200

// ReadStep reads step stepID of task taskID in one snapshot at asOf (nil: the database's now). A step that does
// not exist, or belongs to another task, is an error wrapping ErrNotFound.
func ReadStep(ctx context.Context, db Beginner, taskID, stepID int64, asOf *time.Time) (*StepDetail, error) {
	return ReadStepPage(ctx, db, taskID, stepID, StepOptions{AsOf: asOf, ElementsAfter: -1})
}

// ReadStepPage is ReadStep with the page of a map step's elements opts chooses, read in the same snapshot.
func ReadStepPage(ctx context.Context, db Beginner, taskID, stepID int64, opts StepOptions) (*StepDetail, error) {
	asOf := opts.AsOf
	limit := opts.ElementsLimit
	if limit <= 0 {
		limit = DefaultElementsLimit
	}
	d := &StepDetail{}
	err := Snapshot(ctx, db, func(tx pgx.Tx) error {
		var err error
		if d.AsOf, err = Now(ctx, tx, asOf); err != nil {
			return err
		}
		err = tx.QueryRow(ctx, query("step"), taskID, stepID).Scan(&d.TaskID, &d.Input, &d.Output, &d.Iteration,
			&d.MaxIterations, &d.TimeoutMS, &d.Priority, &d.RetryPolicy, &d.Deps, &d.ResolvedInput, &d.InputProblem,
			&d.Wait, &d.WaitUntil)
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
		if d.Events, _, err = eventsPage(ctx, tx, taskID, stepID, 0, StepEventsLimit); err != nil {
			return err
		}
		if len(d.Wait) > 0 {
			if d.Signals, err = collect(ctx, tx, "signals", scanSignal, taskID); err != nil {
				return err
			}
		}
		if d.Map == nil {
			return nil
		}
		// One more than the page says whether another follows.
		if d.Elements, err = collect(ctx, tx, "elements", func(row pgx.Row, e *Element) error {
			return row.Scan(&e.ID, &e.Name, &e.Index, &e.State, &e.Attempts, &e.MaxAttempts, &e.LastError, &e.Output)
		}, stepID, opts.ElementsAfter, limit+1); err != nil {
			return err
		}
		if len(d.Elements) > limit {
			d.Elements, d.MoreElements = d.Elements[:limit], true
		}
		return nil
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
