package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
)

// The operator commands wrap the SQL functions of SPEC §9 (cancel_task, pause_task, resume_task, reset_task,
// retry_step_now, resolve_step). Each runs in one transaction that reads the row before and after the call,
// so the command prints what changed; a refusal is the database's message and exit status 1.

// taskChange is what a task operator command prints; its JSON form is stable.
type taskChange struct {
	TaskID         int64  `json:"task_id"`
	Action         string `json:"action"`
	Changed        bool   `json:"changed"`
	StepsAffected  *int32 `json:"steps_affected,omitempty"`
	PreviousStatus string `json:"previous_status"`
	Status         string `json:"status"`
	PreviousPaused bool   `json:"previous_paused"`
	Paused         bool   `json:"paused"`
}

// stepChange is what a step operator command prints; its JSON form is stable.
type stepChange struct {
	StepID                int64           `json:"step_id"`
	TaskID                int64           `json:"task_id"`
	Name                  string          `json:"name"`
	Action                string          `json:"action"`
	PreviousState         string          `json:"previous_state"`
	State                 string          `json:"state"`
	PreviousNextAttemptAt *time.Time      `json:"previous_next_attempt_at"`
	NextAttemptAt         *time.Time      `json:"next_attempt_at"`
	Attempts              int32           `json:"attempts"`
	PreviousMaxAttempts   *int32          `json:"previous_max_attempts"`
	MaxAttempts           *int32          `json:"max_attempts"`
	Output                json.RawMessage `json:"output,omitempty"`
	TaskStatus            string          `json:"task_status"`
}

// taskOperation is one task operator command.
type taskOperation struct {
	use, short, long, example string
	action                    string
	// call runs the SQL function; it returns the number of steps affected (nil when the function returns a
	// boolean) and whether anything changed.
	call func(ctx context.Context, tx pgx.Tx, id int64) (*int32, bool, error)
}

func newTaskOperatorCommands(o *dbOptions) []*cobra.Command {
	var reason string
	ops := []taskOperation{
		{
			use: "cancel TASK_ID", short: "Cancel a task: every step not finished becomes cancelled",
			long: "Cancel a task (stepready.cancel_task): every step that has not finished becomes cancelled; a running\n" +
				"attempt is fenced out (its result is refused). Refused for a complete or cancelled task.",
			example: "  scheduler task cancel 12 --reason \"wrong input\"",
			action:  "cancel",
			call: func(ctx context.Context, tx pgx.Tx, id int64) (*int32, bool, error) {
				var n int32
				var r *string
				if reason != "" {
					r = &reason
				}
				err := tx.QueryRow(ctx, `SELECT stepready.cancel_task($1, $2)`, id, r).Scan(&n)
				return &n, true, err
			},
		},
		{
			use: "pause TASK_ID", short: "Pause a task: none of its steps is claimed or started until resumed",
			long: "Pause a task (stepready.pause_task): none of its steps is claimed or started until `scheduler task\n" +
				"resume`; attempts already running finish. Refused for a complete or cancelled task.",
			example: "  scheduler task pause 12",
			action:  "pause",
			call: func(ctx context.Context, tx pgx.Tx, id int64) (*int32, bool, error) {
				var changed bool
				err := tx.QueryRow(ctx, `SELECT stepready.pause_task($1)`, id).Scan(&changed)
				return nil, changed, err
			},
		},
		{
			use: "resume TASK_ID", short: "Resume a paused task",
			long:    "Resume a paused task (stepready.resume_task). Nothing changes when it was not paused.",
			example: "  scheduler task resume 12",
			action:  "resume",
			call: func(ctx context.Context, tx pgx.Tx, id int64) (*int32, bool, error) {
				var changed bool
				err := tx.QueryRow(ctx, `SELECT stepready.resume_task($1)`, id).Scan(&changed)
				return nil, changed, err
			},
		},
		{
			use: "reset TASK_ID", short: "Resume from failure: error, skipped and cancelled steps back to pending",
			long: "Reset a task (stepready.reset_task): every error, skipped and cancelled step goes back to pending\n" +
				"with a fresh retry budget; completed steps keep their outputs. Refused when no step is in error,\n" +
				"skipped or cancelled.",
			example: "  scheduler task reset 12",
			action:  "reset",
			call: func(ctx context.Context, tx pgx.Tx, id int64) (*int32, bool, error) {
				var n int32
				err := tx.QueryRow(ctx, `SELECT stepready.reset_task($1)`, id).Scan(&n)
				return &n, n > 0, err
			},
		},
	}
	cmds := make([]*cobra.Command, 0, len(ops))
	for _, op := range ops {
		cmd := &cobra.Command{
			Use: op.use, Short: op.short, Long: op.long, Example: op.example,
			Args: usageArgs(cobra.ExactArgs(1)),
			RunE: func(cmd *cobra.Command, args []string) error {
				id, err := parseID("TASK_ID", args[0])
				if err != nil {
					return err
				}
				return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
					ch, err := runTaskOperation(cmd.Context(), conn, op, id)
					if err != nil {
						return err
					}
					if format == outputJSON {
						return writeJSON(cmd.OutOrStdout(), ch)
					}
					ch.print(cmd)
					return nil
				})
			},
		}
		if op.action == "cancel" {
			cmd.Flags().StringVar(&reason, "reason", "", "why, recorded in the operator.cancel event")
		}
		cmds = append(cmds, cmd)
	}
	return cmds
}

func runTaskOperation(ctx context.Context, conn *pgx.Conn, op taskOperation, id int64) (*taskChange, error) {
	ch := &taskChange{TaskID: id, Action: op.action}
	err := operatorTx(ctx, conn, func(tx pgx.Tx) error {
		const read = `SELECT status, paused FROM stepready.tasks WHERE id = $1`
		if err := tx.QueryRow(ctx, read, id).Scan(&ch.PreviousStatus, &ch.PreviousPaused); err != nil {
			if err == pgx.ErrNoRows {
				return fmt.Errorf("task %d does not exist", id)
			}
			return err
		}
		n, changed, err := op.call(ctx, tx, id)
		if err != nil {
			return err
		}
		ch.StepsAffected, ch.Changed = n, changed
		return tx.QueryRow(ctx, read, id).Scan(&ch.Status, &ch.Paused)
	})
	if err != nil {
		return nil, err
	}
	return ch, nil
}

func (c *taskChange) print(cmd *cobra.Command) {
	out := cmd.OutOrStdout()
	switch c.Action {
	case "cancel":
		fmt.Fprintf(out, "task %d cancelled: %d step(s) cancelled\n", c.TaskID, *c.StepsAffected)
	case "pause":
		if !c.Changed {
			fmt.Fprintf(out, "task %d was already paused: nothing changed\n", c.TaskID)
			return
		}
		fmt.Fprintf(out, "task %d paused: no step of it starts until `scheduler task resume %d`\n", c.TaskID, c.TaskID)
	case "resume":
		if !c.Changed {
			fmt.Fprintf(out, "task %d was not paused: nothing changed\n", c.TaskID)
			return
		}
		fmt.Fprintf(out, "task %d resumed\n", c.TaskID)
	case "reset":
		fmt.Fprintf(out, "task %d reset: %d step(s) back to pending\n", c.TaskID, *c.StepsAffected)
	}
	if c.PreviousStatus != c.Status {
		fmt.Fprintf(out, "status: %s → %s\n", c.PreviousStatus, c.Status)
	} else {
		fmt.Fprintf(out, "status: %s\n", c.Status)
	}
}

// newStepCommand builds `scheduler step`: retry and resolve.
func newStepCommand(_ *globalOptions) *cobra.Command {
	var o dbOptions
	cmd := &cobra.Command{
		Use:   "step",
		Short: "Operate on one step: retry it now, resolve it by hand",
		Long:  "Operate on one step, named by its id (34) or by its task's id and its name (12/fetch).",
	}
	cmd.PersistentFlags().StringVar(&o.url, "database-url", "", "PostgreSQL URL of the stepready database")
	setDefaultText(cmd.PersistentFlags(), "database-url", "none")

	retry := &cobra.Command{
		Use:   "retry STEP_ID | TASK_ID/STEP_NAME",
		Short: "Retry a step now: clear its backoff, or give a step in error exactly one more attempt",
		Long: "Retry a step now (stepready.retry_step_now): a pending or waiting step loses its backoff; a step in\n" +
			"error gets exactly one more attempt (even after a non-retryable failure or an open circuit breaker)\n" +
			"and its task leaves error once no step of it is in error. Refused for other states and cancelled tasks.",
		Example: "  scheduler step retry 34\n  scheduler step retry 12/fetch\n  scheduler step retry 34 --output json",
		Args:    usageArgs(cobra.ExactArgs(1)),
	}
	retry.Flags().StringVarP(&o.output, "output", "o", outputTable,
		"output format: table (for people) or json (stable, for scripts)")
	retry.RunE = func(cmd *cobra.Command, args []string) error {
		ref, err := parseStepRef(args[0])
		if err != nil {
			return err
		}
		return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
			id, err := ref.resolve(cmd.Context(), conn)
			if err != nil {
				return err
			}
			ch, err := runStepOperation(cmd.Context(), conn, "retry", id, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT stepready.retry_step_now($1)`, id)
				return err
			})
			if err != nil {
				return err
			}
			return ch.write(cmd, format)
		})
	}

	var (
		output string
		format string
	)
	resolve := &cobra.Command{
		Use:   "resolve STEP_ID | TASK_ID/STEP_NAME --output JSON",
		Short: "Resolve a step by hand with the given output; its dependents proceed",
		Long: "Resolve a step by hand (stepready.resolve_step): it becomes resolved_manually with the given output\n" +
			"(a JSON document, or @FILE to read it from a file), and its dependents proceed as if it had completed.\n" +
			"Refused for a complete or resolved step and for a cancelled task. Here --output is the step's output;\n" +
			"the print format is --format.",
		Example: "  scheduler step resolve 34 --output '{\"rows\": 0}'\n" +
			"  scheduler step resolve 34 --output @fixed.json --format json",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := parseStepRef(args[0])
			if err != nil {
				return err
			}
			doc, err := jsonArg("--output", output)
			if err != nil {
				return err
			}
			if format != outputTable && format != outputJSON {
				return usagef("--format %q: want %s or %s", format, outputTable, outputJSON)
			}
			o.output = format
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				id, err := ref.resolve(cmd.Context(), conn)
				if err != nil {
					return err
				}
				ch, err := runStepOperation(cmd.Context(), conn, "resolve", id, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `SELECT stepready.resolve_step($1, $2::jsonb)`, id, string(doc))
					return err
				})
				if err != nil {
					return err
				}
				return ch.write(cmd, format)
			})
		},
	}
	resolve.Flags().StringVar(&output, "output", "", "the step's output: a JSON document, or @FILE (required)")
	resolve.Flags().StringVar(&format, "format", outputTable,
		"output format: table (for people) or json (stable, for scripts)")
	cmd.AddCommand(retry, resolve)
	return cmd
}

func runStepOperation(ctx context.Context, conn *pgx.Conn, action string, id int64,
	call func(context.Context, pgx.Tx) error,
) (*stepChange, error) {
	ch := &stepChange{StepID: id, Action: action}
	err := operatorTx(ctx, conn, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT state, next_attempt_at, max_attempts FROM stepready.steps WHERE id = $1`, id).
			Scan(&ch.PreviousState, &ch.PreviousNextAttemptAt, &ch.PreviousMaxAttempts)
		if err == pgx.ErrNoRows {
			return fmt.Errorf("step %d does not exist", id)
		} else if err != nil {
			return err
		}
		if err := call(ctx, tx); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT s.task_id, s.name, s.state, s.next_attempt_at, s.attempts, s.max_attempts,
				s.output, t.status
			FROM stepready.steps s JOIN stepready.tasks t ON t.id = s.task_id WHERE s.id = $1`, id).
			Scan(&ch.TaskID, &ch.Name, &ch.State, &ch.NextAttemptAt, &ch.Attempts, &ch.MaxAttempts, &ch.Output,
				&ch.TaskStatus)
	})
	if err != nil {
		return nil, err
	}
	if action != "resolve" {
		ch.Output = nil
	}
	return ch, nil
}

func (c *stepChange) write(cmd *cobra.Command, format string) error {
	if format == outputJSON {
		return writeJSON(cmd.OutOrStdout(), c)
	}
	out := cmd.OutOrStdout()
	verb := map[string]string{"retry": "retried", "resolve": "resolved"}[c.Action]
	fmt.Fprintf(out, "step %d %q (task %d) %s\n", c.StepID, c.Name, c.TaskID, verb)
	fmt.Fprintf(out, "state: %s → %s\n", c.PreviousState, c.State)
	if c.PreviousNextAttemptAt != nil && c.NextAttemptAt == nil {
		fmt.Fprintln(out, "backoff cleared: may start now")
	}
	if orDash(c.PreviousMaxAttempts) != orDash(c.MaxAttempts) {
		fmt.Fprintf(out, "max_attempts: %s → %s (attempts so far: %d)\n", orDash(c.PreviousMaxAttempts),
			orDash(c.MaxAttempts), c.Attempts)
	}
	fmt.Fprintf(out, "task status: %s\n", c.TaskStatus)
	return nil
}
