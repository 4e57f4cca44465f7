package store

import (
	"context"
	"encoding/json"
	"fmt"
)

// SendSignal calls send_signal (SPEC §20): signal name with payload to task taskID; key nil sends without an
// idempotency key. It returns the signal's id (the first signal's id when key was used before for the task).
func SendSignal(ctx context.Context, db DBTX, taskID int64, name string, payload json.RawMessage, key *string) (int64, error) {
	var id int64
	if err := db.QueryRow(ctx, `SELECT stepready.send_signal($1, $2, $3::jsonb, $4)`, taskID, name, string(payload),
		key).Scan(&id); err != nil {
		return 0, fmt.Errorf("store: send signal %q to task %d: %w", name, taskID, err)
	}
	return id, nil
}

// SendSignalToKey calls send_signal_to_key: as SendSignal, the task named by its idempotency key taskKey.
func SendSignalToKey(ctx context.Context, db DBTX, taskKey, name string, payload json.RawMessage, key *string) (int64, error) {
	var id int64
	if err := db.QueryRow(ctx, `SELECT stepready.send_signal_to_key($1, $2, $3::jsonb, $4)`, taskKey, name,
		string(payload), key).Scan(&id); err != nil {
		return 0, fmt.Errorf("store: send signal %q to the task with key %q: %w", name, taskKey, err)
	}
	return id, nil
}
