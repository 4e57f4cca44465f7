package readmodel

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// WaitingStep is a step waiting for a signal now (SPEC §20).
type WaitingStep struct {
	TaskID int64  `json:"task_id"`
	StepID int64  `json:"step_id"`
	Name   string `json:"name"`
	// Signal is the name of the signal it waits for.
	Signal string `json:"signal"`
}

// WaitingForSignal returns the steps of the tasks taskIDs that wait for a signal now, oldest first.
func WaitingForSignal(ctx context.Context, q Querier, taskIDs []int64) ([]WaitingStep, error) {
	return collect(ctx, q, "waiting_for_signal", func(row pgx.Row, w *WaitingStep) error {
		return row.Scan(&w.TaskID, &w.StepID, &w.Name, &w.Signal)
	}, taskIDs)
}
