package stepready

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

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
func CreateTask(ctx context.Context, db DBTX, definition json.RawMessage) (int64, error) {
	if !utf8.Valid(definition) {
		return 0, fmt.Errorf("%w: definition: not valid UTF-8 (at byte %d)", ErrInvalidDefinition, invalidUTF8At(definition))
	}
	if err := rules.Validate(definition); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalidDefinition, err)
	}
	var id int64
	if err := db.QueryRow(ctx, `SELECT stepready.create_task($1)`, definition).Scan(&id); err != nil {
		return 0, createError(err)
	}
	return id, nil
}

// Created is the result of CreateTasks for one definition: the task's id and whether this call created it
// (false when its idempotency key named an existing task, or an earlier definition of the same call).
type Created struct {
	// TaskID is the id of the task the definition stands for.
	TaskID int64

	// Created is true when this call inserted the task.
	Created bool
}

// CreateTasks creates the tasks of many definitions at once with stepready.create_tasks (SPEC §12): one
// statement for the whole batch, all or nothing. The result has one entry per definition, in order. Each
// definition is checked as CreateTask checks one (UTF-8, then the outcome rules compiled), and every error
// names the definition's 0-based index: `definitions[3]: steps[1] "load": rules[0].when: …`. Idempotency keys
// repeated within the batch, or already used, return the existing task with Created false. An empty slice
// creates nothing and returns an empty result. db is a pool, a connection or a transaction.
func CreateTasks(ctx context.Context, db DBTX, definitions []json.RawMessage) ([]Created, error) {
	if len(definitions) == 0 {
		return []Created{}, nil
	}
	for i, definition := range definitions {
		if !utf8.Valid(definition) {
			return nil, fmt.Errorf("%w: definitions[%d]: definition: not valid UTF-8 (at byte %d)",
				ErrInvalidDefinition, i, invalidUTF8At(definition))
		}
		if err := rules.Validate(definition); err != nil {
			return nil, fmt.Errorf("%w: definitions[%d]: %w", ErrInvalidDefinition, i, err)
		}
	}
	batch, err := json.Marshal(definitions)
	if err != nil {
		// A definition that is not JSON at all: say which.
		for i, definition := range definitions {
			if !json.Valid(definition) {
				return nil, fmt.Errorf("%w: definitions[%d]: definition: not valid JSON", ErrInvalidDefinition, i)
			}
		}
		return nil, fmt.Errorf("%w: %w", ErrInvalidDefinition, err)
	}
	// As json.RawMessage, not []byte: pgx sends a []byte as bytea in the query modes that do not ask the server
	// for the parameter's type (exec, simple protocol: the modes that work through a transaction pooler).
	rows, err := db.Query(ctx, `SELECT ordinal, task_id, created FROM stepready.create_tasks($1)`,
		json.RawMessage(batch))
	if err != nil {
		return nil, createError(err)
	}
	defer rows.Close()
	out := make([]Created, 0, len(definitions))
	for rows.Next() {
		var ordinal int
		var c Created
		if err := rows.Scan(&ordinal, &c.TaskID, &c.Created); err != nil {
			return nil, fmt.Errorf("stepready: create tasks: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, createError(err)
	}
	if len(out) != len(definitions) {
		return nil, fmt.Errorf("stepready: create tasks: %d rows for %d definitions", len(out), len(definitions))
	}
	return out, nil
}

// createError classifies an error of the creation functions: class 22 (data exception) is the definition's
// fault (create_task's own checks, 22023, and what jsonb refuses to hold, such as \u0000 in a string, 22P05,
// or a number out of its range, 22003), and so is a check constraint (23514).
func createError(err error) error {
	if code := store.SQLState(err); strings.HasPrefix(code, "22") || code == "23514" {
		return fmt.Errorf("%w: %w", ErrInvalidDefinition, err)
	}
	return fmt.Errorf("stepready: create task: %w", err)
}

// invalidUTF8At returns the offset of the first byte of b that is not part of valid UTF-8.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(b)
}
