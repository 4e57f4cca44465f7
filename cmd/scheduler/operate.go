package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready"
)

// The operator commands are faces of the library's operator actions (stepready.CancelTask, …, the SQL functions of
// SPEC §9): each prints what changed; a refusal is the database's message and exit status 1.

// cliActor is the actor the CLI's operator actions record (details.actor of their operator.* events).
var cliActor = stepready.OperatorOptions{Actor: "cli"}

// taskOperation is one task operator command.
type taskOperation struct {
	use, short, long, example string
	action                    string
	// call runs the library's action.
	call func(ctx context.Context, conn *pgx.Conn, id int64) (*stepready.TaskChange, error)
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
			call: func(ctx context.Context, conn *pgx.Conn, id int64) (*stepready.TaskChange, error) {
				return stepready.CancelTask(ctx, conn, id, reason, cliActor)
			},
		},
		{
			use: "pause TASK_ID", short: "Pause a task: none of its steps is claimed or started until resumed",
			long: "Pause a task (stepready.pause_task): none of its steps is claimed or started until `scheduler task\n" +
				"resume`; attempts already running finish. Refused for a complete or cancelled task.",
			example: "  scheduler task pause 12",
			action:  "pause",
			call: func(ctx context.Context, conn *pgx.Conn, id int64) (*stepready.TaskChange, error) {
				return stepready.PauseTask(ctx, conn, id, cliActor)
			},
		},
		{
			use: "resume TASK_ID", short: "Resume a paused task",
			long:    "Resume a paused task (stepready.resume_task). Nothing changes when it was not paused.",
			example: "  scheduler task resume 12",
			action:  "resume",
			call: func(ctx context.Context, conn *pgx.Conn, id int64) (*stepready.TaskChange, error) {
				return stepready.ResumeTask(ctx, conn, id, cliActor)
			},
		},
		{
			use: "reset TASK_ID", short: "Resume from failure: error, skipped and cancelled steps back to pending",
			long: "Reset a task (stepready.reset_task): every error, skipped and cancelled step goes back to pending\n" +
				"with a fresh retry budget; completed steps keep their outputs. Refused when no step is in error,\n" +
				"skipped or cancelled.",
			example: "  scheduler task reset 12",
			action:  "reset",
			call: func(ctx context.Context, conn *pgx.Conn, id int64) (*stepready.TaskChange, error) {
				return stepready.ResetTask(ctx, conn, id, cliActor)
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
					ch, err := op.call(cmd.Context(), conn, id)
					if err != nil {
						return err
					}
					if format == outputJSON {
						return writeJSON(cmd.OutOrStdout(), ch)
					}
					printTaskChange(cmd, ch)
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

func printTaskChange(cmd *cobra.Command, c *stepready.TaskChange) {
	out := cmd.OutOrStdout()
	switch c.Action {
	case "cancel":
		fmt.Fprintf(out, "task %d cancelled: %s cancelled\n", c.TaskID, countOf(int(*c.StepsAffected), "step"))
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
		fmt.Fprintf(out, "task %d reset: %s back to pending\n", c.TaskID, countOf(int(*c.StepsAffected), "step"))
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
			ch, err := stepready.RetryStepNow(cmd.Context(), conn, id, cliActor)
			if err != nil {
				return err
			}
			return writeStepChange(cmd, ch, format)
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
				ch, err := stepready.ResolveStep(cmd.Context(), conn, id, doc, cliActor)
				if err != nil {
					return err
				}
				return writeStepChange(cmd, ch, format)
			})
		},
	}
	resolve.Flags().StringVar(&output, "output", "", "the step's output: a JSON document, or @FILE (required)")
	resolve.Flags().StringVar(&format, "format", outputTable,
		"output format: table (for people) or json (stable, for scripts)")
	cmd.AddCommand(retry, resolve)
	return cmd
}

func writeStepChange(cmd *cobra.Command, c *stepready.StepChange, format string) error {
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
