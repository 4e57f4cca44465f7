package stepready

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/rules"
)

// ErrInvalidDefinition wraps every validation failure of CreateTask: the message names the field, the step and,
// for rules, the rule index.
var ErrInvalidDefinition = errors.New("stepready: invalid task definition")

// CreateTask validates a task definition (the JSON of docs/functions.md) and creates the task, returning its id. The
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
	wakeAfter(ctx, db, id)
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

// createTasksBatch and createTasksBatchBytes bound one create_tasks call of CreateTasks: at most 1,000
// definitions (the size at which a call's fixed costs are spread thin: creating 4-step chains costs about 10 %
// more per task in calls of 100, twice as much in calls of 10) and at most 8 MiB of JSON (a larger definition goes
// alone). Variables so that tests can make batches small.
var (
	createTasksBatch      = 1000
	createTasksBatchBytes = 8 << 20
)

// CreateTasks creates the tasks of many definitions with stepready.create_tasks (docs/functions.md). The result has one
// entry per definition, in order. Each definition is checked as CreateTask checks one (UTF-8, then valid JSON
// and the outcome rules compiled), all of them before anything is sent; every error names the definition's 0-based
// index: `definitions[3]: steps[1] "load": rules[0].when: …`. Idempotency keys repeated in the input, or already
// used, return the existing task with Created false. An empty slice creates nothing and returns an empty result.
// db is a pool, a connection or a transaction.
//
// Inputs of any size: the definitions are sent in batches of at most 1,000 definitions and 8 MiB, one
// create_tasks statement each, in input order. Each batch is all or nothing and follows the idempotency rules
// above, keys of earlier batches included (their tasks exist by then). With a transaction as db, the batches
// are all part of it: the whole input is all or nothing. With a pool or a connection each batch commits on its
// own: when one fails, the batches before it stay created, and CreateTasks returns their results with the error
// (nothing of the failing batch or after it is written); creating the same input again with idempotency keys
// resumes where it stopped.
//
// Given a pool or a connection, CreateTask and CreateTasks wake the daemons once their work is committed (Wake);
// given a transaction they cannot, and the daemons find the tasks through their probe of the wake-up counter
// after your commit, or at once if you call Wake then.
func CreateTasks(ctx context.Context, db DBTX, definitions []json.RawMessage) ([]Created, error) {
	if len(definitions) == 0 {
		return []Created{}, nil
	}
	for i, definition := range definitions {
		if !utf8.Valid(definition) {
			return nil, fmt.Errorf("%w: definitions[%d]: definition: not valid UTF-8 (at byte %d)",
				ErrInvalidDefinition, i, invalidUTF8At(definition))
		}
		// Also parses the definition: JSON that is not valid is reported here, naming it.
		if err := rules.Validate(definition); err != nil {
			return nil, fmt.Errorf("%w: definitions[%d]: %w", ErrInvalidDefinition, i, err)
		}
	}
	out := make([]Created, 0, len(definitions))
	var batch []byte
	for start := 0; start < len(definitions); {
		// The batch: at least one definition, then as many as fit.
		batch = append(batch[:0], '[')
		end := start
		for end < len(definitions) && end-start < createTasksBatch &&
			(end == start || len(batch)+len(definitions[end])+1 <= createTasksBatchBytes) {
			if end > start {
				batch = append(batch, ',')
			}
			batch = append(batch, definitions[end]...)
			end++
		}
		batch = append(batch, ']')
		created, err := createBatch(ctx, db, batch, end-start)
		if err != nil {
			if len(out) > 0 {
				wakeAfter(ctx, db, out[0].TaskID)
			}
			return out, createError(renumber(err, start))
		}
		out = append(out, created...)
		start = end
	}
	wakeAfter(ctx, db, out[0].TaskID)
	return out, nil
}

// createBatch runs create_tasks on one JSON array of n definitions. The array goes as json.RawMessage: in pgx's
// exec and simple protocol modes (the ones that work through PgBouncer) a []byte would go as bytea.
func createBatch(ctx context.Context, db DBTX, batch []byte, n int) ([]Created, error) {
	rows, err := db.Query(ctx, `SELECT ordinal, task_id, created FROM stepready.create_tasks($1)`,
		json.RawMessage(batch))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]Created, 0, n)
	for rows.Next() {
		var ordinal int
		var c Created
		if err := rows.Scan(&ordinal, &c.TaskID, &c.Created); err != nil {
			return nil, fmt.Errorf("stepready: create tasks: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) != n {
		return nil, fmt.Errorf("stepready: create tasks: %d rows for %d definitions", len(out), n)
	}
	return out, nil
}

// renumber turns the `definitions[i]` of a create_tasks error about a batch that starts at definition offset into
// the index in the caller's input. The error stays a *pgconn.PgError with its SQLSTATE.
func renumber(err error, offset int) error {
	var pgErr *pgconn.PgError
	if offset == 0 || !errors.As(err, &pgErr) {
		return err
	}
	var i int
	var rest string
	if n, _ := fmt.Sscanf(pgErr.Message, "definitions[%d]", &i); n != 1 {
		return err
	}
	_, rest, _ = strings.Cut(pgErr.Message, "]")
	renumbered := *pgErr
	renumbered.Message = fmt.Sprintf("definitions[%d]%s", offset+i, rest)
	return &renumbered
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
