package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/readmodel"
)

// taskCreated is what `scheduler task create` prints; its JSON form is stable.
type taskCreated struct {
	TaskID         int64   `json:"task_id"`
	Created        bool    `json:"created"`
	Template       *string `json:"template,omitempty"`
	IdempotencyKey *string `json:"idempotency_key,omitempty"`
	Steps          int32   `json:"steps"`
	// RunAt is the task's delayed start (--run-at, --in, or run_at in the file), when it is still to come.
	RunAt *time.Time `json:"run_at,omitempty"`
}

// newTaskCreateCommand builds `scheduler task create`.
func newTaskCreateCommand(o *dbOptions) *cobra.Command {
	var (
		file, contextArg, key, runAtArg, contextsFile string
		in                                            time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create TEMPLATE [--contexts-file FILE] | -f FILE",
		Short: "Create tasks from a stored template, or from YAML or JSON task definitions",
		Long: "Create a task from the newest version of a stored template (stepready.create_task_from_template),\n" +
			"with --context merged over the template's context (top-level keys win); or, with -f, from a file\n" +
			"holding one task definition, YAML or JSON (stepready.create_task). With an idempotency key that already\n" +
			"names a task, nothing is created and that task's id is printed (--output id prints the id alone, for a\n" +
			"script). --run-at or --in delays the start of the task: no step of it is claimed before that time\n" +
			"(docs/schedules.md); a run_at in the file does the same, and the flags replace it.\n\n" +
			"Many at once (stepready.create_tasks, all or nothing, in one transaction): -f with JSON lines (one\n" +
			"definition per line), a YAML stream (documents separated by ---) or a JSON array of definitions, or\n" +
			"TEMPLATE --contexts-file FILE with one JSON context per line. JSON lines and YAML streams are read one\n" +
			"definition at a time and sent in batches of 1,000, so a file of any size is created in bounded memory\n" +
			"(a JSON array is read whole); -f - reads standard input. An invalid definition is reported with its\n" +
			"line (FILE:LINE: definitions[i]: ...) and nothing is created. On a terminal, a progress line goes to\n" +
			"standard error. Once committed, one line per task is printed, with the start of a task that starts\n" +
			"later (with --output json, one JSON object per line: ordinal, task_id, created, and run_at for such a\n" +
			"task).",
		Example: "  scheduler task create etl --context '{\"day\": \"2030-01-01\"}'\n" +
			"  scheduler task create etl --context @context.json --idempotency-key etl-2030-01-01\n" +
			"  scheduler task create -f task.yaml\n" +
			"  scheduler task create -f tasks.json           # a JSON array of definitions\n" +
			"  scheduler task create -f tasks.jsonl          # JSON lines, any size\n" +
			"  scheduler task create etl --contexts-file days.jsonl\n" +
			"  scheduler task create etl --in 1h\n" +
			"  scheduler task create etl --run-at 2030-01-01T02:00:00Z",
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var (
				definition json.RawMessage
				ctxDoc     json.RawMessage
				template   *string
			)
			var runAt *time.Time
			switch {
			case runAtArg != "" && in != 0:
				return usagef("give --run-at or --in, not both")
			case runAtArg != "":
				t, err := time.Parse(time.RFC3339Nano, runAtArg)
				if err != nil {
					return usagef("--run-at %q: want an RFC 3339 time such as 2030-01-01T02:00:00Z", runAtArg)
				}
				runAt = &t
			case in < 0:
				return usagef("--in %s: must not be negative", in)
			}
			switch {
			case file != "" && len(args) > 0:
				return usagef("give a TEMPLATE or -f FILE, not both")
			case contextsFile != "" && len(args) == 0:
				return usagef("--contexts-file needs a TEMPLATE")
			case file != "":
				if contextArg != "" {
					return usagef("--context applies to a template; with -f, put the context in the file")
				}
				df, err := openDefinitionFile(file)
				if err != nil {
					return err
				}
				defer df.Close()
				if !df.single {
					if key != "" {
						return usagef("--idempotency-key applies to one task; in a file of many, give each its own idempotency_key")
					}
					return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
						res, err := createFromFile(cmd.Context(), conn, df, runAt, in, newProgressLine(cmd.ErrOrStderr()))
						if err != nil {
							return err
						}
						return writeCreated(cmd.OutOrStdout(), format, res)
					})
				}
				definition = df.first.json
				if key == "" {
					var d struct {
						Key *string `json:"idempotency_key"`
					}
					if json.Unmarshal(definition, &d) == nil && d.Key != nil {
						key = *d.Key
					}
				} else {
					var d map[string]any
					_ = json.Unmarshal(definition, &d)
					d["idempotency_key"] = key
					definition, _ = json.Marshal(d)
				}
			case len(args) == 1 && contextsFile != "":
				if contextArg != "" || key != "" {
					return usagef("--contexts-file gives every task its context: drop --context and --idempotency-key")
				}
				contexts, err := readContextsFile(contextsFile)
				if err != nil {
					return err
				}
				return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
					res, err := createBulk(cmd.Context(), conn, args[0], contexts, runAt, in)
					if err != nil {
						return err
					}
					return writeBulk(cmd.OutOrStdout(), format, res)
				})
			case len(args) == 1:
				template = &args[0]
				if contextArg != "" {
					var err error
					if ctxDoc, err = jsonArg("--context", contextArg); err != nil {
						return err
					}
				}
			default:
				return usagef("give a TEMPLATE name or -f FILE")
			}
			return o.withConnFormats(cmd.Context(), []string{outputID}, func(conn *pgx.Conn, format string) error {
				res := &taskCreated{Template: template, Created: true}
				if key != "" {
					res.IdempotencyKey = &key
				}
				err := pgx.BeginFunc(cmd.Context(), conn, func(tx pgx.Tx) error {
					if _, err := startOf(cmd.Context(), tx, &runAt, in); err != nil {
						return err
					}
					if runAt != nil && definition != nil {
						var d map[string]any
						if err := json.Unmarshal(definition, &d); err != nil {
							return err
						}
						d["run_at"] = runAt.Format(time.RFC3339Nano)
						definition, _ = json.Marshal(d)
					}
					if err := createTask(cmd.Context(), tx, res, definition, ctxDoc, runAt); err != nil {
						return err
					}
					if runAt != nil && res.Created {
						res.RunAt = runAt
					}
					return nil
				})
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				switch format {
				case outputJSON:
					return writeJSON(out, res)
				case outputID:
					// The id alone, created or found by its idempotency key: what a script captures.
					fmt.Fprintln(out, res.TaskID)
					return nil
				}
				if !res.Created {
					fmt.Fprintf(out, "task %d already exists with idempotency key %q: nothing created\n", res.TaskID, key)
					return nil
				}
				from := "from " + termSafe(file)
				if template != nil {
					from = "from template " + termSafe(*template)
				}
				when := ""
				if res.RunAt != nil {
					when = ", scheduled to start at " + res.RunAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(out, "task %d created %s (%s)%s\n", res.TaskID, from, countOf(int(res.Steps), "step"), when)
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "",
		"a file of task definitions: one (YAML or JSON), JSON lines, a YAML stream or a JSON array; - for standard input")
	cmd.Flags().StringVar(&contextArg, "context", "", "the task's context: a JSON object, or @FILE (with TEMPLATE)")
	cmd.Flags().StringVar(&contextsFile, "contexts-file", "",
		"with TEMPLATE: create one task per line of FILE, each line a JSON context (JSON lines), in one transaction")
	cmd.Flags().StringVar(&key, "idempotency-key", "",
		"create the task only if no task has this key; else print the existing task's id")
	cmd.Flags().StringVar(&runAtArg, "run-at", "", "start the task no earlier than this time (RFC 3339)")
	cmd.Flags().DurationVar(&in, "in", 0, "start the task no earlier than this long from now (database time), e.g. 1h")
	return cmd
}

// createTask creates the task in tx through the library (a definition, or a template with its context) and fills
// res: found instead when its idempotency key names a task. runAt is the start time of a task made from a
// template; a definition carries its own run_at.
func createTask(ctx context.Context, tx pgx.Tx, res *taskCreated, definition, ctxDoc json.RawMessage,
	runAt *time.Time) error {
	var c stepready.Created
	var err error
	if res.Template != nil {
		var key string
		if res.IdempotencyKey != nil {
			key = *res.IdempotencyKey
		}
		var opts stepready.TemplateOptions
		if runAt != nil {
			opts.RunAt = *runAt
		}
		c, err = stepready.CreateTaskFromTemplate(ctx, tx, *res.Template,
			stepready.FromTemplate{Context: ctxDoc, IdempotencyKey: key}, opts)
	} else {
		var cs []stepready.Created
		if cs, err = stepready.CreateTasks(ctx, tx, []json.RawMessage{definition}); err == nil {
			c = cs[0]
		}
	}
	if err != nil {
		return oneDefinitionError(err)
	}
	res.TaskID, res.Created = c.TaskID, c.Created
	// Its steps, and its start when a run_at of the definition (or the template) holds it back.
	created, err := readmodel.ReadCreatedTask(ctx, tx, res.TaskID)
	if err != nil {
		return err
	}
	res.Steps, res.RunAt = created.Steps, created.RunAt
	return nil
}

// countOf is "1 step", "2 steps".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// oneDefinitionError words an error of creating one task as stepready.create_task words it: the database's
// message, without the `definitions[0]: ` of the call for many that created it.
func oneDefinitionError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	msg := strings.TrimPrefix(pgErr.Message, "definitions[0]: ")
	if pgErr.Detail != "" {
		msg += " (" + pgErr.Detail + ")"
	}
	return refusalError{msg: msg, err: err}
}
