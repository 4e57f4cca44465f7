package readmodel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Task is a task with its execution context.
type Task struct {
	TaskSummary
	Priority    int32           `json:"priority"`
	Context     json.RawMessage `json:"context"`
	CompletedAt *time.Time      `json:"completed_at"`
	// RunAt is the task's delayed start (SPEC §15); nil: none.
	RunAt *time.Time `json:"run_at,omitempty"`
	// ExecutionStatus is task_execution_context's execution_status at AsOf.
	ExecutionStatus string `json:"execution_status"`
	// NextAttemptAt is the earliest next attempt of a step waiting out its backoff.
	NextAttemptAt *time.Time `json:"next_attempt_at"`
}

// Step is a step of a task with its readiness.
type Step struct {
	ID            int64      `json:"id"`
	Name          string     `json:"name"`
	Handler       string     `json:"handler"`
	Queue         string     `json:"queue"`
	State         string     `json:"state"`
	Attempts      int32      `json:"attempts"`
	MaxAttempts   *int32     `json:"max_attempts"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	// Ready and BlockedReason are step_readiness's at AsOf.
	Ready         bool    `json:"ready"`
	BlockedReason *string `json:"blocked_reason"`
	// Why is explain's message for BlockedReason ("waiting for parent fetch (in_progress)", "concurrency limited by
	// tenant:7: 2 of 2 in flight"); empty when the step is ready.
	Why       string          `json:"why,omitempty"`
	LastError json.RawMessage `json:"last_error"`
	// Parents are the names of the step's parents, in id order.
	Parents []string `json:"parents"`
	// Output is the step's output (SPEC §18; NULL until it completes or is resolved).
	Output json.RawMessage `json:"output"`
	// Map is a map step's progress over its elements (SPEC §19); nil for any other step.
	Map *MapProgress `json:"map,omitempty"`
	// MapStepID and ElementIndex say, of an element of a map step (named NAME[i]), its map step and its index;
	// nil for any other step.
	MapStepID    *int64 `json:"map_step_id,omitempty"`
	ElementIndex *int32 `json:"element_index,omitempty"`
}

// MapProgress is a map step's progress: its elements by outcome. Before the map step fans out (when a claim picks
// it) FannedOut is false and every count is 0.
type MapProgress struct {
	FannedOut bool `json:"fanned_out"`
	// Total is the number of elements; Done those complete or resolved by hand, Failed those in error, InFlight
	// those enqueued or in progress.
	Total    int32 `json:"total"`
	Done     int32 `json:"done"`
	Failed   int32 `json:"failed"`
	InFlight int32 `json:"in_flight"`
}

// IsElement says whether the step is an element of a map step.
func (s Step) IsElement() bool { return s.MapStepID != nil }

// LastErrorText is the step's last error as "class: message" (whitespace runs collapsed), or "" when it has none or
// has since succeeded (complete, resolved by hand: the error belongs to an attempt that no longer matters). Every
// face shows this in its step tables; the whole document stays in LastError.
func (s Step) LastErrorText() string {
	if s.State == "complete" || s.State == "resolved_manually" {
		return ""
	}
	return ErrorText(s.LastError)
}

// ErrorText is "class: message" of an error document (a last_error, an attempt's failure), "" when it has
// neither.
func ErrorText(doc json.RawMessage) string {
	var e struct {
		Class   string `json:"class"`
		Message string `json:"message"`
	}
	if len(doc) == 0 || json.Unmarshal(doc, &e) != nil || (e.Class == "" && e.Message == "") {
		return ""
	}
	return strings.TrimSuffix(e.Class+": "+strings.Join(strings.Fields(e.Message), " "), ": ")
}

func scanStep(row pgx.Row, s *Step) error {
	var why *string
	var isMap bool
	var total, done, failed, inFlight *int32
	err := row.Scan(&s.ID, &s.Name, &s.Handler, &s.Queue, &s.State, &s.Attempts, &s.MaxAttempts, &s.NextAttemptAt,
		&s.Ready, &s.BlockedReason, &why, &s.LastError, &s.Parents, &s.Output, &isMap, &total, &done, &failed,
		&inFlight, &s.MapStepID, &s.ElementIndex)
	if isMap {
		s.Map = &MapProgress{FannedOut: total != nil, Total: deref(total), Done: deref(done), Failed: deref(failed),
			InFlight: deref(inFlight)}
	}
	if why != nil {
		s.Why = *why
	}
	if s.Parents == nil {
		s.Parents = []string{}
	}
	return err
}

// Edge is one dependency: Child waits for Parent.
type Edge struct {
	Parent int64 `json:"parent_step_id"`
	Child  int64 `json:"child_step_id"`
}

// Attempt is one attempt of a step, from its events.
type Attempt struct {
	StepID  int64      `json:"step_id"`
	Attempt int32      `json:"attempt"`
	Started time.Time  `json:"started"`
	Ended   *time.Time `json:"ended"`
	// Outcome is attempt.succeeded, attempt.failed, lease.expired or running.
	Outcome string `json:"outcome"`
	// Error is the details of the failure (nil unless it failed).
	Error json.RawMessage `json:"error,omitempty"`
}

func scanAttempt(row pgx.Row, a *Attempt) error {
	return row.Scan(&a.StepID, &a.Attempt, &a.Started, &a.Ended, &a.Outcome, &a.Error)
}

// TaskDetail is everything a task's page shows, read in one snapshot.
type TaskDetail struct {
	Task
	// AsOf is the instant readiness and times were computed for (the snapshot's now, or the caller's).
	AsOf time.Time `json:"as_of"`
	// StepList are the task's steps (Steps is their count), by id.
	StepList []Step `json:"step_list"`
	Edges    []Edge `json:"edges"`
	// Attempts are every attempt of every step, by start (with TaskOptions.Attempts).
	Attempts []Attempt `json:"attempts,omitempty"`
	// Events are a page of the task's events, newest first (with TaskOptions.Events); MoreEvents says that
	// older ones follow (read them with EventsBefore = the last one's id).
	Events     []Event `json:"events,omitempty"`
	MoreEvents bool    `json:"more_events,omitempty"`
}

// TaskOptions says what ReadTask reads beyond the task, its steps and edges.
type TaskOptions struct {
	// AsOf pins the instant readiness is computed for (nil: the database's now).
	AsOf *time.Time
	// Attempts adds every attempt of every step.
	Attempts bool
	// Events adds a page of EventsLimit events older than EventsBefore (0: the newest).
	Events       bool
	EventsBefore int64
	EventsLimit  int
}

// ReadTask reads task id with its steps (readiness and the first reason of each), edges and, as opts asks, its
// attempts and a page of events, all in one snapshot. A task that does not exist is an error wrapping
// ErrNotFound.
func ReadTask(ctx context.Context, db Beginner, id int64, opts TaskOptions) (*TaskDetail, error) {
	var d *TaskDetail
	err := Snapshot(ctx, db, func(tx pgx.Tx) error {
		var err error
		if d, err = readTaskSteps(ctx, tx, id, nil, opts.AsOf); err != nil {
			return err
		}
		if d.Edges, err = collect(ctx, tx, "edges", func(row pgx.Row, e *Edge) error {
			return row.Scan(&e.Parent, &e.Child)
		}, id); err != nil {
			return err
		}
		if opts.Attempts {
			if d.Attempts, err = collect(ctx, tx, "attempts", scanAttempt, id, nil); err != nil {
				return err
			}
		}
		if opts.Events {
			d.Events, d.MoreEvents, err = eventsPage(ctx, tx, id, 0, opts.EventsBefore, opts.EventsLimit)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// readTaskSteps reads task id and its steps (only these, unless nil) with their readiness at asOf (nil: now).
func readTaskSteps(ctx context.Context, q Querier, id int64, only []int64, asOf *time.Time) (*TaskDetail, error) {
	d := &TaskDetail{}
	var err error
	if d.AsOf, err = Now(ctx, q, asOf); err != nil {
		return nil, err
	}
	t := &d.Task
	err = q.QueryRow(ctx, query("task"), id, d.AsOf).Scan(&t.ID, &t.Name, &t.Namespace, &t.Status, &t.Paused,
		&t.Steps, &t.StepsUnsatisfied, &t.CreatedAt, &t.UpdatedAt, &t.Priority, &t.Context, &t.CompletedAt,
		&t.RunAt, &t.ExecutionStatus, &t.NextAttemptAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFoundf("task %d does not exist", id)
	}
	if err != nil {
		return nil, fmt.Errorf("readmodel: task: %w", err)
	}
	if d.StepList, err = collect(ctx, q, "steps", scanStep, id, d.AsOf, only); err != nil {
		return nil, err
	}
	d.Edges = []Edge{}
	return d, nil
}

// CreatedTask is what a creating face says about a task it just created or found: its number of steps and its
// start when that is still to come.
type CreatedTask struct {
	// Steps is the task's number of steps.
	Steps int32
	// RunAt is the task's run_at when it is after the transaction's now(), else nil.
	RunAt *time.Time
}

// ReadCreatedTask reads a CreatedTask (an error wrapping ErrNotFound if the task does not exist).
func ReadCreatedTask(ctx context.Context, q Querier, taskID int64) (CreatedTask, error) {
	var c CreatedTask
	err := q.QueryRow(ctx, query("created_task"), taskID).Scan(&c.Steps, &c.RunAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, notFoundf("task %d does not exist", taskID)
	}
	if err != nil {
		return c, fmt.Errorf("readmodel: created task: %w", err)
	}
	return c, nil
}

func deref(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}
