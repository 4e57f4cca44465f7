package store

import (
	"context"
	"encoding/json"
)

// SendSignal calls send_signal (SPEC §20): signal name with payload to task taskID; key nil sends without an
// idempotency key. It returns the signal's id (the first signal's id when key was used before for the task), or
// the database's error as it is (its message is the refusal an operator reads).
func SendSignal(ctx context.Context, db DBTX, taskID int64, name string, payload json.RawMessage, key *string) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `SELECT stepready.send_signal($1, $2, $3::jsonb, $4)`, taskID, name, string(payload),
		key).Scan(&id)
	return id, err
}

// SendSignalToKey calls send_signal_to_key: as SendSignal, the task named by its idempotency key taskKey.
func SendSignalToKey(ctx context.Context, db DBTX, taskKey, name string, payload json.RawMessage, key *string) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `SELECT stepready.send_signal_to_key($1, $2, $3::jsonb, $4)`, taskKey, name,
		string(payload), key).Scan(&id)
	return id, err
}
