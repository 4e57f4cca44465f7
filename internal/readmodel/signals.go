package readmodel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Signal is one signal of a task's mailbox (stepready.signals, SPEC §20): consumed by a step, or buffered until a
// step starts waiting for its name.
type Signal struct {
	ID             int64           `json:"id"`
	TaskID         int64           `json:"task_id"`
	Name           string          `json:"name"`
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey *string         `json:"idempotency_key"`
	CreatedAt      time.Time       `json:"created_at"`
	// ConsumedBy is the step that took it (nil: buffered), ConsumedByName that step's name.
	ConsumedBy     *int64     `json:"consumed_by"`
	ConsumedByName *string    `json:"consumed_by_name"`
	ConsumedAt     *time.Time `json:"consumed_at"`
}

func scanSignal(row pgx.Row, g *Signal) error {
	return row.Scan(&g.ID, &g.TaskID, &g.Name, &g.Payload, &g.IdempotencyKey, &g.CreatedAt, &g.ConsumedBy,
		&g.ConsumedByName, &g.ConsumedAt)
}

// Signals returns task taskID's signals, oldest first (ErrNotFound when the task does not exist).
func Signals(ctx context.Context, q Querier, taskID int64) ([]Signal, error) {
	var exists bool
	if err := q.QueryRow(ctx, query("task_exists"), taskID).Scan(&exists); err != nil {
		return nil, fmt.Errorf("readmodel: task_exists: %w", err)
	}
	if !exists {
		return nil, notFoundf("task %d does not exist", taskID)
	}
	return collect(ctx, q, "signals", scanSignal, taskID)
}

// ReadSignal returns signal id (ErrNotFound when it does not exist).
func ReadSignal(ctx context.Context, q Querier, id int64) (Signal, error) {
	var g Signal
	err := scanSignal(q.QueryRow(ctx, query("signal"), id), &g)
	if errors.Is(err, pgx.ErrNoRows) {
		return g, notFoundf("signal %d does not exist", id)
	}
	if err != nil {
		return g, fmt.Errorf("readmodel: signal: %w", err)
	}
	return g, nil
}
