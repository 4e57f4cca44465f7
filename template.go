package stepready

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/stepready/stepready/internal/store"
)

// FromTemplate is one task to create from a stored template: the context merged over the template's (top-level
// keys of Context win; nil keeps the template's context) and an optional idempotency key ("" for none).
type FromTemplate struct {
	// Context is the task's context, a JSON object merged over the template's; nil keeps the template's.
	Context json.RawMessage

	// IdempotencyKey, when not empty, creates the task only if no task has this key yet.
	IdempotencyKey string
}

// TemplateOptions apply to every task of one CreateTasksFromTemplate or CreateTaskFromTemplate call.
type TemplateOptions struct {
	// RunAt, when not zero, is the tasks' start time: no step of them starts before it (it overrides a run_at
	// of the template). At most one of RunAt and Delay.
	RunAt time.Time

	// Delay, when positive, starts the tasks no earlier than this long after the database's clock at creation
	// (the database's time, not this process's). At most one of RunAt and Delay.
	Delay time.Duration
}

// CreateTaskFromTemplate creates one task from the newest version of the stored template named template
// (stepready.create_tasks_from_template). The result says whether this call created the task or found it by
// its idempotency key (a task found keeps its own run_at). db is a pool, a connection or a transaction.
func CreateTaskFromTemplate(ctx context.Context, db DBTX, template string, task FromTemplate,
	opts TemplateOptions) (Created, error) {
	out, err := CreateTasksFromTemplate(ctx, db, template, []FromTemplate{task}, opts)
	if err != nil {
		return Created{}, err
	}
	return out[0], nil
}

// CreateTasksFromTemplate creates one task per element of tasks from the newest version of the stored template
// named template, through stepready.create_tasks_from_template: the result has one entry per element, in order,
// and follows CreateTasks' rules (idempotency keys, all or nothing per batch of at most 1,000 tasks, errors
// naming `definitions[i]` by the index in tasks; with a transaction as db the whole input is all or nothing).
// A missing template is ErrNotFound (the message names it); a context that makes the definition invalid is
// ErrInvalidDefinition.
func CreateTasksFromTemplate(ctx context.Context, db DBTX, template string, tasks []FromTemplate,
	opts TemplateOptions) ([]Created, error) {
	if !opts.RunAt.IsZero() && opts.Delay != 0 {
		return nil, fmt.Errorf("%w: give at most one of RunAt and Delay", ErrInvalidDefinition)
	}
	if opts.Delay < 0 {
		return nil, fmt.Errorf("%w: Delay must not be negative, got %s", ErrInvalidDefinition, opts.Delay)
	}
	var runAt *time.Time
	if !opts.RunAt.IsZero() {
		runAt = &opts.RunAt
	}
	var delay *float64
	if opts.Delay > 0 {
		s := opts.Delay.Seconds()
		delay = &s
	}
	out := make([]Created, 0, len(tasks))
	for start := 0; start < len(tasks); start += createTasksBatch {
		end := min(start+createTasksBatch, len(tasks))
		contexts := make([]json.RawMessage, 0, end-start)
		keys := make([]*string, 0, end-start)
		for i := start; i < end; i++ {
			t := tasks[i]
			if !utf8.Valid(t.Context) {
				return out, fmt.Errorf("%w: definitions[%d]: context: not valid UTF-8 (at byte %d)",
					ErrInvalidDefinition, i, invalidUTF8At(t.Context))
			}
			c := t.Context
			if len(c) == 0 || string(c) == "null" {
				// Merged over the template's context (an object, or none): the template's context as it is.
				c = json.RawMessage(`{}`)
			}
			contexts = append(contexts, c)
			if t.IdempotencyKey != "" {
				keys = append(keys, &t.IdempotencyKey)
			} else {
				keys = append(keys, nil)
			}
		}
		doc, err := json.Marshal(contexts)
		if err != nil {
			return out, fmt.Errorf("%w: %w", ErrInvalidDefinition, err)
		}
		created, err := templateBatch(ctx, db, template, doc, keys, runAt, delay)
		if err != nil {
			if len(out) > 0 {
				wakeAfter(ctx, db, out[0].TaskID)
			}
			return out, templateError(renumber(err, start))
		}
		out = append(out, created...)
	}
	if len(out) > 0 {
		wakeAfter(ctx, db, out[0].TaskID)
	}
	return out, nil
}

// templateBatch runs create_tasks_from_template once; the delay is added to the database's now() in the same
// statement.
func templateBatch(ctx context.Context, db DBTX, template string, contexts []byte, keys []*string,
	runAt *time.Time, delay *float64) ([]Created, error) {
	rows, err := db.Query(ctx, `
		SELECT ordinal, task_id, created
		  FROM stepready.create_tasks_from_template($1, $2::jsonb, $3::text[],
		           COALESCE($4::timestamptz, now() + make_interval(secs => $5::float8)))`,
		template, json.RawMessage(contexts), keys, runAt, delay)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Created
	for rows.Next() {
		var ordinal int
		var c Created
		if err := rows.Scan(&ordinal, &c.TaskID, &c.Created); err != nil {
			return nil, fmt.Errorf("stepready: create tasks from template: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) != len(keys) {
		return nil, fmt.Errorf("stepready: create tasks from template: %d rows for %d contexts", len(out), len(keys))
	}
	return out, nil
}

// templateError classifies an error of create_tasks_from_template: no_data_found (P0002) is a missing template
// (ErrNotFound, with the database's message: `template "nightly" does not exist`), everything else as
// createError.
func templateError(err error) error {
	if store.SQLState(err) == "P0002" {
		return notFoundError{err}
	}
	return createError(err)
}
