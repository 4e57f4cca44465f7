package main

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready"
)

// newStepCommand builds `scheduler step`: retry and resolve.
func newStepCommand(_ *globalOptions) *cobra.Command {
	var o dbOptions
	cmd := &cobra.Command{
		Use:   "step",
		Short: "One step: show it, retry it now, resolve it by hand",
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
		return o.withStep(cmd.Context(), ref, func(conn *pgx.Conn, id int64, format string) error {
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
			return o.withStep(cmd.Context(), ref, func(conn *pgx.Conn, id int64, format string) error {
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
	cmd.AddCommand(newStepShowCommand(&o), retry, resolve)
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
