package readmodel

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reason is one reason a step may not start now (a row of stepready.explain_step), in plain words.
type Reason struct {
	StepID            int64      `json:"-"`
	Reason            string     `json:"reason"`
	Message           string     `json:"message"`
	ParentStepID      *int64     `json:"parent_step_id,omitempty"`
	ParentName        *string    `json:"parent_name,omitempty"`
	ParentState       *string    `json:"parent_state,omitempty"`
	ParentAttempts    *int32     `json:"parent_attempts,omitempty"`
	ParentMaxAttempts *int32     `json:"parent_max_attempts,omitempty"`
	NextAttemptAt     *time.Time `json:"next_attempt_at,omitempty"`
	WaitMs            *int64     `json:"wait_ms,omitempty"`
}

func scanReason(row pgx.Row, r *Reason) error {
	return row.Scan(&r.StepID, &r.Reason, &r.Message, &r.ParentStepID, &r.ParentName, &r.ParentState,
		&r.ParentAttempts, &r.ParentMaxAttempts, &r.NextAttemptAt, &r.WaitMs)
}

func reasons(ctx context.Context, q Querier, name string, id int64, asOf time.Time) ([]Reason, error) {
	return collect(ctx, q, name, scanReason, id, asOf)
}

// ExplainedStep is a step with every reason it may not start now.
type ExplainedStep struct {
	StepID      int64    `json:"step_id"`
	Name        string   `json:"name"`
	State       string   `json:"state"`
	Attempts    int32    `json:"attempts"`
	MaxAttempts *int32   `json:"max_attempts"`
	Ready       bool     `json:"ready"`
	Reasons     []Reason `json:"reasons"`
}

// Explanation says why the steps of a task (or one of them) are not ready.
type Explanation struct {
	TaskID     int64           `json:"task_id"`
	TaskName   string          `json:"task_name"`
	TaskStatus string          `json:"task_status"`
	TaskPaused bool            `json:"task_paused"`
	AsOf       time.Time       `json:"as_of"`
	Steps      []ExplainedStep `json:"steps"`
}

// Explain reads, in one snapshot at asOf (nil: the database's now), every step of task taskID (or only step
// stepID, unless 0) with every reason it may not start now, in precedence order. A missing task or step is an
// error wrapping ErrNotFound.
func Explain(ctx context.Context, db Beginner, taskID, stepID int64, asOf *time.Time) (*Explanation, error) {
	var x *Explanation
	err := Snapshot(ctx, db, func(tx pgx.Tx) error {
		var only []int64
		if stepID != 0 {
			only = []int64{stepID}
		}
		d, err := readTaskSteps(ctx, tx, taskID, only, asOf)
		if err != nil {
			return err
		}
		x = &Explanation{TaskID: d.ID, TaskName: d.Name, TaskStatus: d.Status, TaskPaused: d.Paused, AsOf: d.AsOf,
			Steps: make([]ExplainedStep, len(d.StepList))}
		index := map[int64]int{}
		for i, s := range d.StepList {
			index[s.ID] = i
			x.Steps[i] = ExplainedStep{StepID: s.ID, Name: s.Name, State: s.State, Attempts: s.Attempts,
				MaxAttempts: s.MaxAttempts, Ready: s.Ready, Reasons: []Reason{}}
		}
		var all []Reason
		if stepID != 0 {
			all, err = reasons(ctx, tx, "reasons_step", stepID, d.AsOf)
		} else {
			all, err = reasons(ctx, tx, "reasons_task", taskID, d.AsOf)
		}
		for _, r := range all {
			if i, ok := index[r.StepID]; ok {
				x.Steps[i].Reasons = append(x.Steps[i].Reasons, r)
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return x, nil
}
