package store

import (
	"context"
	"encoding/json"
)

// SendSignal calls send_signal (SPEC §20): signal name with payload to task taskID; key nil sends without an
// idempotency key; actor is recorded as details.actor (NameActor, for the rest of the transaction). One statement:
// on a pool or a connection it is its own transaction, a single round trip. It returns the signal's id (the first
// signal's id when key was used before for the task), or the database's error as it is (its message is the refusal
// an operator reads).
func SendSignal(ctx context.Context, db DBTX, actor string, taskID int64, name string, payload json.RawMessage,
	key *string) (int64, error) {
	var id int64
	// The subquery names the actor first: a volatile call in a subquery's select list keeps it from being
	// pulled up, so set_config runs before send_signal reads the setting.
	err := db.QueryRow(ctx, `SELECT stepready.send_signal($1, $2, $3::jsonb, $4)
		FROM (SELECT pg_catalog.set_config('stepready.actor', $5, true) AS actor) a`, taskID, name, string(payload),
		key, actor).Scan(&id)
	return id, err
}

// SendSignalToKey calls send_signal_to_key: as SendSignal, the task named by its idempotency key taskKey.
func SendSignalToKey(ctx context.Context, db DBTX, actor string, taskKey, name string, payload json.RawMessage,
	key *string) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `SELECT stepready.send_signal_to_key($1, $2, $3::jsonb, $4)
		FROM (SELECT pg_catalog.set_config('stepready.actor', $5, true) AS actor) a`, taskKey, name,
		string(payload), key, actor).Scan(&id)
	return id, err
}
