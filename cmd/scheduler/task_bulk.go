package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepready/stepready"
)

// bulkCreated is one line of `task create` in bulk mode (a YAML stream or JSON array with -f, or
// --contexts-file): one per definition or context, in input order.
type bulkCreated struct {
	// Ordinal is the 1-based position of the definition or context in the input.
	Ordinal int `json:"ordinal"`
	// TaskID is the task's id: new, or the existing task holding the same idempotency key.
	TaskID int64 `json:"task_id"`
	// Created is false when the idempotency key named an existing task (or an earlier element of the input).
	Created bool `json:"created"`
}

// readContextsFile reads JSON lines: one context (a JSON value, normally an object) per non-blank line. The
// error names the line.
func readContextsFile(file string) (json.RawMessage, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, usageError{err}
	}
	defer f.Close()
	var contexts []json.RawMessage
	r := bufio.NewReader(f)
	for line := 1; ; line++ {
		text, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(text)) > 0 {
			if !json.Valid(text) {
				return nil, usagef("%s:%d: not a JSON value (--contexts-file takes JSON lines: one context per line)",
					file, line)
			}
			contexts = append(contexts, json.RawMessage(bytes.TrimSpace(text)))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file, err)
		}
	}
	if len(contexts) == 0 {
		return nil, usagef("%s: no contexts (one JSON context per line)", file)
	}
	return json.Marshal(contexts)
}

// createBulk creates many tasks in one transaction: definitions through stepready.CreateTasks, or, when template
// is set, contexts through stepready.create_tasks_from_template. runAt, when set, delays every created task.
func createBulk(ctx context.Context, conn *pgx.Conn, definitions []json.RawMessage, template string,
	contexts json.RawMessage, runAt *time.Time, in time.Duration) ([]bulkCreated, error) {
	var out []bulkCreated
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if in > 0 {
			var t time.Time
			if err := tx.QueryRow(ctx, `SELECT now() + make_interval(secs => $1)`, in.Seconds()).Scan(&t); err != nil {
				return err
			}
			runAt = &t
		}
		if template == "" {
			if runAt != nil {
				for i, def := range definitions {
					var d map[string]any
					if err := json.Unmarshal(def, &d); err != nil {
						return fmt.Errorf("definitions[%d]: %w", i, err)
					}
					d["run_at"] = runAt.Format(time.RFC3339Nano)
					definitions[i], _ = json.Marshal(d)
				}
			}
			created, err := stepready.CreateTasks(ctx, tx, definitions)
			if err != nil {
				return err
			}
			for i, c := range created {
				out = append(out, bulkCreated{Ordinal: i + 1, TaskID: c.TaskID, Created: c.Created})
			}
			return nil
		}
		rows, err := tx.Query(ctx, `SELECT ordinal, task_id, created FROM stepready.create_tasks_from_template($1, $2)`,
			template, string(contexts))
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowToStructByPos[bulkCreated])
		if err != nil {
			return err
		}
		if runAt != nil {
			// A template carries no start time of its own: set it on the tasks created here before they commit.
			var ids []int64
			for _, c := range out {
				if c.Created {
					ids = append(ids, c.TaskID)
				}
			}
			if _, err := tx.Exec(ctx, `UPDATE stepready.tasks SET run_at = $2 WHERE id = ANY ($1)`, ids, *runAt); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// writeBulk prints one line per task: a table line, or with --output json one JSON object per line.
func writeBulk(w io.Writer, format string, res []bulkCreated) error {
	created := 0
	for _, c := range res {
		if format == outputJSON {
			b, err := json.Marshal(c)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%s\n", b)
			continue
		}
		if c.Created {
			created++
			fmt.Fprintf(w, "%d\ttask %d created\n", c.Ordinal, c.TaskID)
		} else {
			fmt.Fprintf(w, "%d\ttask %d already exists with this idempotency key: nothing created\n", c.Ordinal, c.TaskID)
		}
	}
	if format != outputJSON {
		fmt.Fprintf(w, "%d of %d tasks created\n", created, len(res))
	}
	return nil
}
