package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
)

// taskStatuses are the choices of --status: the values of tasks.status (SPEC §2), and paused.
var taskStatuses = readmodel.TaskFilterStatuses

// newTaskListCommand builds `scheduler task list`.
func newTaskListCommand(o *dbOptions) *cobra.Command {
	var (
		status, name string
		limit        int
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List tasks, newest first",
		Example: "  scheduler task list\n" +
			"  scheduler task list --status error --limit 10\n" +
			"  scheduler task list --name etl --output json",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if status != "" && !slices.Contains(taskStatuses, status) {
				return usagef("--status %q: want one of %s", status, strings.Join(taskStatuses, ", "))
			}
			if limit < 1 {
				return usagef("--limit %d: must be 1 or more", limit)
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				tx, err := conn.BeginTx(cmd.Context(), pgx.TxOptions{AccessMode: pgx.ReadOnly})
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback(context.WithoutCancel(cmd.Context())) }()
				now, err := o.dbNow(cmd.Context(), tx)
				if err != nil {
					return err
				}
				tasks, err := readmodel.ListTasks(cmd.Context(), tx, readmodel.TaskFilter{Status: status, Name: name,
					Limit: limit})
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), tasks)
				}
				tw := newTable(cmd.OutOrStdout())
				fmt.Fprintln(tw, "ID\tNAME\tSTATUS\tSTEPS\tCREATED\tUPDATED")
				for _, t := range tasks {
					st := t.Status
					if t.Paused {
						st += " (paused)"
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", t.ID, termSafe(t.Name), st, t.Steps, relative(t.CreatedAt, now),
						relative(t.UpdatedAt, now))
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().StringVar(&status, "status", "", "only tasks with this status: "+strings.Join(taskStatuses, ", "))
	cmd.Flags().StringVar(&name, "name", "", "only tasks with this name")
	cmd.Flags().IntVar(&limit, "limit", 50, "at most this many tasks")
	addAsOfFlag(cmd, o)
	return cmd
}
