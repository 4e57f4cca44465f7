package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/stepready/stepready/migrations"
)

// newMigrateCommand builds `scheduler migrate` and its subcommands.
func newMigrateCommand(opts *globalOptions) *cobra.Command {
	var urlFlag string

	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Migrate the database schema (stepready tables, functions and triggers, River's tables)",
	}
	cmd.PersistentFlags().StringVar(&urlFlag, "database-url", "",
		"PostgreSQL URL of the database to migrate")
	setDefaultText(cmd.PersistentFlags(), "database-url", "none")

	var skipRoles bool
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending schema version, re-apply all functions and triggers, migrate River",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := databaseURL(urlFlag)
			if err != nil {
				return err
			}
			logger, err := opts.logger()
			if err != nil {
				return err
			}
			return migrations.UpWith(cmd.Context(), url, logger, migrations.UpOptions{SkipRoles: skipRoles})
		},
	}
	up.Flags().BoolVar(&skipRoles, "skip-roles", false,
		"do not create the roles stepready_client, _worker, _operator and _reader (for a migrating user without\n"+
			"CREATEROLE, when a DBA created them); their privileges are granted all the same")

	var steps int
	down := &cobra.Command{
		Use:   "down",
		Short: "Step the stepready schema down (all versions unless --steps); River's tables go with the last",
		Long: "Step the stepready schema down: every version with --steps 0 (the default), else that many versions.\n" +
			"River's tables are removed only with the last stepready version: a rollback of some versions keeps\n" +
			"them. Data in removed tables is lost.",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if steps < 0 {
				return usagef("--steps %d: must be 0 (all) or more", steps)
			}
			url, err := databaseURL(urlFlag)
			if err != nil {
				return err
			}
			logger, err := opts.logger()
			if err != nil {
				return err
			}
			return migrations.Down(cmd.Context(), url, logger, steps)
		},
	}
	down.Flags().IntVar(&steps, "steps", 0, "number of stepready schema versions to remove; 0 removes all")

	status := &cobra.Command{
		Use:   "status",
		Short: "Print the applied and latest schema versions",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := databaseURL(urlFlag)
			if err != nil {
				return err
			}
			state, err := migrations.Status(cmd.Context(), url)
			if err != nil {
				return err
			}
			dirty := ""
			if state.Dirty {
				dirty = " (dirty: a migration failed part-way; see `scheduler migrate force`)"
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "stepready schema: version %d of %d%s\n", state.Version, state.Latest, dirty)
			fmt.Fprintf(out, "river schema:     version %d of %d\n", state.RiverVersion, state.RiverLatest)
			switch {
			case state.Dirty:
				// Up refuses a dirty schema: repair, force, then up (upgrades.md).
				fmt.Fprintln(out, "dirty: repair the database, then `scheduler migrate force VERSION`, then `scheduler migrate up`")
			case state.UpToDate():
				fmt.Fprintln(out, "up to date")
			default:
				fmt.Fprintln(out, "pending: run `scheduler migrate up`")
			}
			return nil
		},
	}

	force := &cobra.Command{
		Use:   "force VERSION",
		Short: "Record VERSION as the applied stepready schema version and clear the dirty flag (repair only)",
		Long: "Record VERSION as the applied stepready schema version and clear the dirty flag, running no\n" +
			"migration. Use it after a failed migration, once the database is repaired: every migration file runs\n" +
			"in its own transaction, so after a failure the version really in place is the one before the failed one.\n" +
			"VERSION -1 records that no version is applied.",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			version, err := strconv.Atoi(args[0])
			if err != nil {
				return usagef("VERSION %q: must be an integer", args[0])
			}
			url, err := databaseURL(urlFlag)
			if err != nil {
				return err
			}
			logger, err := opts.logger()
			if err != nil {
				return err
			}
			return migrations.Force(cmd.Context(), url, logger, version)
		},
	}

	cmd.AddCommand(up, down, status, force)
	return cmd
}
