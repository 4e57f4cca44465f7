package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
)

// newExplainCommand builds `scheduler explain`: why each step of a task (or one step) is not ready, every
// reason in plain words, as stepready.explain_task / explain_step return them.
func newExplainCommand(_ *globalOptions) *cobra.Command {
	var (
		o    dbOptions
		step bool
	)
	cmd := &cobra.Command{
		Use:   "explain TASK_ID | --step STEP_ID | --step TASK_ID/STEP_NAME",
		Short: "Say why steps are not ready: every reason, in plain words",
		Long: "Print every step of a task (or, with --step, one step) with every reason it may not start now, in\n" +
			"the precedence order of step_readiness (the first reason is its blocked_reason): task not active, task\n" +
			"paused, scheduled (run_at), terminal, in flight, each unsatisfied parent, not retryable, retries\n" +
			"exhausted, backoff. A ready\n" +
			"step says \"ready\". Times are relative to the database's clock (or --as-of).",
		Example: "  scheduler explain 12\n" +
			"  scheduler explain --step 34\n" +
			"  scheduler explain --step 12/fetch\n" +
			"  scheduler explain 12 --output json\n" +
			"  scheduler explain 12 --as-of 2030-01-01T12:00:00Z",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var (
				id  int64
				ref stepRef
				err error
			)
			if step {
				ref, err = parseStepRef(args[0])
			} else {
				id, err = parseID("TASK_ID", args[0])
			}
			if err != nil {
				return err
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				if step {
					if id, err = ref.resolve(cmd.Context(), conn); err != nil {
						return err
					}
				}
				report, err := explain(cmd.Context(), conn, &o, id, step)
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), report)
				}
				return report.writeTable(cmd)
			})
		},
	}
	addDBFlags(cmd, &o)
	addAsOfFlag(cmd, &o)
	cmd.Flags().BoolVar(&step, "step", false, "the argument is a step (STEP_ID or TASK_ID/STEP_NAME): explain that step only")
	return cmd
}

// explainReport is what `scheduler explain` prints: the read model's explanation (its JSON form).
type explainReport struct{ *readmodel.Explanation }

// explain reads the task (of the step), its steps' readiness and every reason, in one snapshot.
func explain(ctx context.Context, conn *pgx.Conn, o *dbOptions, id int64, isStep bool) (*explainReport, error) {
	asOf, err := o.asOfTime()
	if err != nil {
		return nil, err
	}
	taskID, stepID := id, int64(0)
	if isStep {
		stepID = id
		if taskID, err = readmodel.StepTask(ctx, conn, id); err != nil {
			return nil, err
		}
	}
	x, err := readmodel.Explain(ctx, conn, taskID, stepID, asOf)
	if err != nil {
		return nil, err
	}
	return &explainReport{x}, nil
}

// writeTable prints one line per reason: STEP NAME STATE ATTEMPT REASON.
func (r *explainReport) writeTable(cmd *cobra.Command) error {
	out := cmd.OutOrStdout()
	paused := ""
	if r.TaskPaused {
		paused = ", paused"
	}
	fmt.Fprintf(out, "task %d %q (%s%s)\n", r.TaskID, r.TaskName, r.TaskStatus, paused)
	tw := newTable(out)
	fmt.Fprintln(tw, "STEP\tNAME\tSTATE\tATTEMPT\tWHY NOT READY")
	for _, s := range r.Steps {
		attempt := fmt.Sprintf("%d/%s", s.Attempts, orDash(s.MaxAttempts))
		if s.Ready {
			// "ready", and which worker it waits for (the waiting_for_worker reason) when it waits for a claim.
			msg := "ready"
			if len(s.Reasons) > 0 {
				msg = s.Reasons[0].Message
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", s.StepID, termSafe(s.Name), s.State, attempt, termSafe(msg))
			continue
		}
		for i, e := range s.Reasons {
			if i == 0 {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", s.StepID, termSafe(s.Name), s.State, attempt, termSafe(e.Message))
			} else {
				fmt.Fprintf(tw, "\t\t\t\t%s\n", termSafe(e.Message))
			}
		}
	}
	return tw.Flush()
}
