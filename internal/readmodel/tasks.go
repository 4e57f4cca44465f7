package readmodel

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// TaskStatuses are the values of tasks.status (SPEC §2), in the order filters offer them.
var TaskStatuses = []string{"pending", "in_progress", "complete", "error", "cancelled"}

// TaskFilterStatuses are what TaskFilter.Status takes: a status, or "paused" for the paused tasks (pause is a
// flag beside the status, and lists show it as one).
var TaskFilterStatuses = append(slices.Clone(TaskStatuses), "paused")

// TaskSummary is one task in a list.
type TaskSummary struct {
	ID        int64  `json:"id"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Status    string `json:"status"`
	Paused    bool   `json:"paused"`
	// Steps is the number of steps; StepsUnsatisfied how many of them do not satisfy a dependency yet.
	Steps            int32     `json:"steps"`
	StepsUnsatisfied int32     `json:"steps_unsatisfied"`
	CreatedAt        time.Time `json:"created_at"`
	UpdatedAt        time.Time `json:"updated_at"`
}

func scanTaskSummary(row pgx.Row, t *TaskSummary) error {
	return row.Scan(&t.ID, &t.Name, &t.Namespace, &t.Status, &t.Paused, &t.Steps, &t.StepsUnsatisfied, &t.CreatedAt,
		&t.UpdatedAt)
}

// TaskFilter selects tasks: empty fields match any value.
type TaskFilter struct {
	// Status is one of TaskFilterStatuses ("paused": the paused tasks, whatever their status).
	Status    string
	Name      string
	Namespace string
	// Before is the keyset cursor: only tasks with a smaller id (the last id of the previous page; 0: from the
	// newest).
	Before int64
	// Limit is the page size (required, > 0).
	Limit int
}

// ListTasks returns the tasks that match f, newest first, at most f.Limit. The page costs what it returns (a
// range of the primary key), however many tasks exist.
func ListTasks(ctx context.Context, q Querier, f TaskFilter) ([]TaskSummary, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("readmodel: ListTasks: limit %d: must be more than 0", f.Limit)
	}
	return collect(ctx, q, "tasks", scanTaskSummary, optText(f.Status), optText(f.Name), optText(f.Namespace),
		optID(f.Before), f.Limit)
}

// StatusCount is the number of tasks of one status.
type StatusCount struct {
	Status string `json:"status"`
	Count  int64  `json:"count"`
}

// StatusCounts is how many tasks there are of each status.
type StatusCounts struct {
	Counts []StatusCount `json:"counts"`
	// Estimated is true when the counts are the planner's estimates (more tasks than the threshold given to
	// CountTasks), not exact.
	Estimated bool `json:"estimated"`
}

// CountTasks counts the tasks per status: exactly while the planner estimates at most threshold tasks, else
// from the planner's statistics (a count of millions of rows on every page view would cost seconds).
func CountTasks(ctx context.Context, q Querier, threshold int64) (StatusCounts, error) {
	var estimate int64
	if err := q.QueryRow(ctx, query("task_count_estimate")).Scan(&estimate); err != nil {
		return StatusCounts{}, fmt.Errorf("readmodel: task count estimate: %w", err)
	}
	c := StatusCounts{Estimated: estimate > threshold}
	name := "status_counts"
	if c.Estimated {
		name = "status_estimates"
	}
	var err error
	c.Counts, err = collect(ctx, q, name, func(row pgx.Row, s *StatusCount) error {
		return row.Scan(&s.Status, &s.Count)
	})
	return c, err
}
