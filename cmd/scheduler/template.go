package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
	"github.com/stepready/stepready/internal/templates"
)

// newTemplateCommand builds `scheduler template`: apply and list task templates (SPEC §10).
func newTemplateCommand(_ *globalOptions) *cobra.Command {
	var o dbOptions
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Define task templates from YAML files and list them",
	}
	addDBFlags(cmd, &o)

	apply := &cobra.Command{
		Use:   "apply FILE...",
		Short: "Store task templates from YAML files (upsert by name and version)",
		Long: "Store task templates from YAML files: each file holds one task definition (SPEC §10) plus an optional\n" +
			"`version` (default 1). Every file is read and checked first (malformed YAML, unknown keys with their\n" +
			"line), then all are stored in one transaction, where the database validates each definition (names,\n" +
			"dependencies, cycles, presets, numbers, backoff): one invalid file stores nothing. A template with the\n" +
			"same name and version is replaced.",
		Example: "  scheduler template apply examples/flaky.yaml\n" +
			"  scheduler template apply templates/*.yaml --output json",
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			ts, err := readTemplates(args)
			if err != nil {
				return err
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				applied, err := templates.Apply(cmd.Context(), conn, ts)
				if err != nil {
					return err
				}
				type schedRow struct {
					Name    string `json:"name"`
					Created bool   `json:"created"`
				}
				type row struct {
					Name      string     `json:"name"`
					Version   int        `json:"version"`
					File      string     `json:"file"`
					Created   bool       `json:"created"`
					Schedules []schedRow `json:"schedules,omitempty"`
				}
				rows := make([]row, 0, len(applied))
				for _, a := range applied {
					r := row{Name: a.Name, Version: a.Version, File: a.File, Created: a.Created}
					for i, d := range a.Template.Schedules {
						r.Schedules = append(r.Schedules, schedRow{d.Name, a.SchedulesCreated[i]})
					}
					rows = append(rows, r)
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), rows)
				}
				for _, r := range rows {
					verb := "replaced"
					if r.Created {
						verb = "created"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "template %s version %d %s (%s)\n", termSafe(r.Name), r.Version, verb,
						termSafe(r.File))
					for _, sr := range r.Schedules {
						verb := "replaced"
						if sr.Created {
							verb = "created"
						}
						fmt.Fprintf(cmd.OutOrStdout(), "schedule %s %s (%s)\n", termSafe(sr.Name), verb, termSafe(r.File))
					}
				}
				return nil
			})
		},
	}

	list := &cobra.Command{
		Use:     "list",
		Short:   "List the stored task templates",
		Example: "  scheduler template list\n  scheduler template list --output json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				out, err := readmodel.Templates(cmd.Context(), conn)
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), out)
				}
				tw := newTable(cmd.OutOrStdout())
				fmt.Fprintln(tw, "NAME\tVERSION\tSTEPS\tNEWEST")
				for _, r := range out {
					newest := ""
					if r.Newest {
						newest = "yes"
					}
					fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", termSafe(r.Name), r.Version, r.Steps, newest)
				}
				return tw.Flush()
			})
		},
	}
	cmd.AddCommand(apply, list)
	return cmd
}

// readTemplates parses every file (all of them, reporting every error) and refuses two files with the same
// name and version.
func readTemplates(files []string) ([]templates.Template, error) {
	var (
		ts   []templates.Template
		errs []error
	)
	seen := map[string]string{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		t, err := templates.Parse(file, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		key := fmt.Sprintf("%s version %d", t.Name, t.Version)
		if other, ok := seen[key]; ok {
			errs = append(errs, fmt.Errorf("%s and %s both define template %s", other, file, key))
			continue
		}
		seen[key] = file
		ts = append(ts, t)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("nothing applied: %w", errors.Join(errs...))
	}
	return ts, nil
}

// taskCreated is what `scheduler task create` prints; its JSON form is stable.
type taskCreated struct {
	TaskID         int64   `json:"task_id"`
	Created        bool    `json:"created"`
	Template       *string `json:"template,omitempty"`
	IdempotencyKey *string `json:"idempotency_key,omitempty"`
	Steps          int32   `json:"steps"`
	// RunAt is the task's delayed start (--run-at, --in), when one was set.
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
			"with --context merged over the template's context (top-level keys win); or, with -f, from a YAML file\n" +
			"holding one task definition (stepready.create_task). With an idempotency key that already names a task,\n" +
			"nothing is created and that task's id is printed. --run-at or --in delays the start of the task: no\n" +
			"step of it is claimed before that time (SPEC §15).\n\n" +
			"Many at once (stepready.create_tasks, all or nothing, in one transaction): -f with JSON lines (one\n" +
			"definition per line), a YAML stream (documents separated by ---) or a JSON array of definitions, or\n" +
			"TEMPLATE --contexts-file FILE with one JSON context per line. JSON lines and YAML streams are read one\n" +
			"definition at a time and sent in batches of 1,000, so a file of any size is created in bounded memory\n" +
			"(a JSON array is read whole); -f - reads standard input. An invalid definition is reported with its\n" +
			"line (FILE:LINE: definitions[i]: ...) and nothing is created. On a terminal, a progress line goes to\n" +
			"standard error. Once committed, one line per task is printed (with --output json, one JSON object per\n" +
			"line: ordinal, task_id, created).",
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
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				res := &taskCreated{Template: template, Created: true}
				if key != "" {
					res.IdempotencyKey = &key
				}
				err := pgx.BeginFunc(cmd.Context(), conn, func(tx pgx.Tx) error {
					if in > 0 {
						var t time.Time
						if err := tx.QueryRow(cmd.Context(), `SELECT now() + make_interval(secs => $1)`,
							in.Seconds()).Scan(&t); err != nil {
							return err
						}
						runAt = &t
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
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), res)
				}
				out := cmd.OutOrStdout()
				switch {
				case !res.Created:
					fmt.Fprintf(out, "task %d already exists with idempotency key %q: nothing created\n", res.TaskID, key)
				case res.RunAt != nil:
					fmt.Fprintf(out, "task %d created (%d steps), scheduled to start at %s\n", res.TaskID, res.Steps,
						res.RunAt.UTC().Format(time.RFC3339))
				case template != nil:
					fmt.Fprintf(out, "task %d created from template %s (%d steps)\n", res.TaskID, termSafe(*template), res.Steps)
				default:
					fmt.Fprintf(out, "task %d created from %s (%d steps)\n", res.TaskID, termSafe(file), res.Steps)
				}
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

// createTask creates the task in tx and fills res. runAt is the start time of a task made from a template
// (create_task_from_template's p_run_at); a definition carries its own run_at.
func createTask(ctx context.Context, tx pgx.Tx, res *taskCreated, definition, ctxDoc json.RawMessage,
	runAt *time.Time) error {
	if res.IdempotencyKey != nil {
		err := tx.QueryRow(ctx, `SELECT id FROM stepready.tasks WHERE idempotency_key = $1`, *res.IdempotencyKey).
			Scan(&res.TaskID)
		if err == nil {
			res.Created = false
		} else if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	if res.Created {
		var err error
		if res.Template != nil {
			var c *string
			if ctxDoc != nil {
				s := string(ctxDoc)
				c = &s
			}
			err = tx.QueryRow(ctx, `SELECT stepready.create_task_from_template($1, $2::jsonb, $3, $4)`,
				*res.Template, c, res.IdempotencyKey, runAt).Scan(&res.TaskID)
		} else {
			err = tx.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`, string(definition)).Scan(&res.TaskID)
		}
		if err != nil {
			return err
		}
	}
	return tx.QueryRow(ctx, `SELECT count(*)::int FROM stepready.steps WHERE task_id = $1`, res.TaskID).
		Scan(&res.Steps)
}
