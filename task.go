package stepready

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/rules"
)

// ErrInvalidDefinition wraps every validation failure of CreateTask: the message names the field, the step and,
// for rules, the rule index.
var ErrInvalidDefinition = errors.New("stepready: invalid task definition")

// CreateTask validates a task definition (the JSON of SPEC §10) and creates the task, returning its id. The
// outcome rules are compiled and type-checked here first (SQL cannot run CEL); everything else is validated by
// stepready.create_task, which writes nothing unless the whole definition is valid. An idempotency key already
// used returns the existing task's id. db is a pool, a connection or a transaction.
func CreateTask(ctx context.Context, db store.DBTX, definition json.RawMessage) (int64, error) {
	if err := rules.Validate(definition); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalidDefinition, err)
	}
	var id int64
	if err := db.QueryRow(ctx, `SELECT stepready.create_task($1)`, definition).Scan(&id); err != nil {
		if code := store.SQLState(err); code == "22023" || code == "23514" {
			return 0, fmt.Errorf("%w: %w", ErrInvalidDefinition, err)
		}
		return 0, fmt.Errorf("stepready: create task: %w", err)
	}
	return id, nil
}
