package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready"
)

// The operator commands are faces of the library's operator actions (stepready.CancelTask, …, the SQL functions of
// SPEC §9): each prints what changed; a refusal is the database's message and exit status 1. The task commands
// (cancel, pause, resume, reset) are here; the step commands (retry, resolve) in step.go.

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
