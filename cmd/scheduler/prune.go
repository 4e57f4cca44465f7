package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready"
)

// newPruneCommand builds `scheduler prune` (SPEC §13).
func newPruneCommand(_ *globalOptions) *cobra.Command {
	var (
		o         dbOptions
		olderThan time.Duration
		statusArg string
		dryRun    bool
	)
	cmd := &cobra.Command{
		Use:   "prune --older-than DURATION [--status complete,cancelled,error] [--dry-run]",
		Short: "Delete finished tasks (with their steps, edges and events) that finished longer ago than DURATION",
		Long: "Delete, with stepready.prune_tasks in batches of 1,000 until none is left, the tasks whose status is one\n" +
			"of --status and that finished (completed_at) more than --older-than ago by the database's clock, with\n" +
			"their steps, edges and events. Unfinished tasks, templates and schedules are never touched. A running\n" +
			"daemon prunes on its own (--retention-complete, --retention-failed); this is for a one-off clean-up.\n" +
			"--dry-run counts what would be deleted and deletes nothing.",
		Example: "  scheduler prune --older-than 720h --dry-run\n" +
			"  scheduler prune --older-than 24h --status complete,cancelled,error",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan < 0 {
				return usagef("--older-than %s: must be 0 or more", olderThan)
			}
			if !cmd.Flags().Changed("older-than") {
				return usagef("--older-than is required (for example --older-than 168h)")
			}
			var statuses []string
			for _, s := range strings.Split(statusArg, ",") {
				s = strings.TrimSpace(s)
				if !slices.Contains([]string{"complete", "cancelled", "error"}, s) {
					return usagef("--status %q: want a comma-separated list of complete, cancelled, error", s)
				}
				if !slices.Contains(statuses, s) {
					statuses = append(statuses, s)
				}
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				res, err := stepready.Prune(cmd.Context(), conn, stepready.PruneOptions{OlderThan: olderThan,
					Statuses: statuses, DryRun: dryRun})
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), res)
				}
				verb := "pruned"
				if dryRun {
					verb = "would be pruned (dry run: nothing deleted)"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s: %s, finished before %s\n", countOf(int(res.Pruned), "task"), verb,
					strings.Join(statuses, ", "), res.FinishedBefore.UTC().Format(time.RFC3339))
				return nil
			})
		},
	}
	addDBFlags(cmd, &o)
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "prune tasks that finished more than this long ago, e.g. 168h")
	cmd.Flags().StringVar(&statusArg, "status", "complete,cancelled", "the statuses to prune (complete, cancelled, error)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be pruned; delete nothing")
	return cmd
}
