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
func CreateTask(ctx context.Context, db store.DBTX, definition json.RawMessage) (int64, error) {
	if !utf8.Valid(definition) {
		return 0, fmt.Errorf("%w: definition: not valid UTF-8 (at byte %d)", ErrInvalidDefinition, invalidUTF8At(definition))
	}
	if err := rules.Validate(definition); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalidDefinition, err)
	}
	var id int64
	if err := db.QueryRow(ctx, `SELECT stepready.create_task($1)`, definition).Scan(&id); err != nil {
		// Class 22 (data exception) is the definition's fault: create_task's own checks (22023), and what jsonb
		// refuses to hold, such as \u0000 in a string (22P05) or a number out of its range (22003).
		if code := store.SQLState(err); strings.HasPrefix(code, "22") || code == "23514" {
			return 0, fmt.Errorf("%w: %w", ErrInvalidDefinition, err)
		}
		return 0, fmt.Errorf("stepready: create task: %w", err)
	}
	return id, nil
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
