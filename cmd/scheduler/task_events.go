package main

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
)

// newTaskEventsCommand builds `scheduler task events`: a task's timeline.
func newTaskEventsCommand(o *dbOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "events TASK_ID",
		Short:   "Print the task's step_events timeline, oldest first",
		Long:    "Print the task's history (stepready.step_events), oldest first: time (UTC), step, attempt, event, state change and details (error, class, chosen delay, jitter sample…).",
		Example: "  scheduler task events 12\n  scheduler task events 12 --output json",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID("TASK_ID", args[0])
			if err != nil {
				return err
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				events, err := readmodel.TaskTimeline(cmd.Context(), conn, id)
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), events)
				}
				tw := newTable(cmd.OutOrStdout())
				fmt.Fprintln(tw, "AT\tSTEP\tATTEMPT\tEVENT\tSTATE\tDETAILS")
				for _, e := range events {
					change := "-"
					if e.FromState != nil || e.ToState != nil {
						change = orDash(e.FromState) + " → " + orDash(e.ToState)
					}
					details := string(e.Details)
					if details == "{}" || details == "" {
						details = "-"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.At.UTC().Format("2006-01-02 15:04:05.000"),
						termSafePtr(e.StepName), orDash(e.Attempt), e.Event, change, termSafe(details))
				}
				return tw.Flush()
			})
		},
	}
	return cmd
}
