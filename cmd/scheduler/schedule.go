package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
	"github.com/stepready/stepready/schedules"
)

// newScheduleCommand builds `scheduler schedule`: cron schedules that create tasks from templates (SPEC §15).
// The work is done by package schedules; this only reads flags and prints.
func newScheduleCommand(_ *globalOptions) *cobra.Command {
	var o dbOptions
	cmd := &cobra.Command{
		Use:   "schedule",
		Short: "Cron schedules that create tasks from templates: create, list, preview, pause, resume, delete",
		Long: "Cron schedules (docs/schedules.md): the elected leader among the running daemons creates one task per\n" +
			"fire time from the schedule's template, with idempotency key schedule:NAME:FIRE_TIME.",
	}
	addDBFlags(cmd, &o)
	cmd.AddCommand(newScheduleCreateCommand(&o), newScheduleListCommand(&o), newSchedulePreviewCommand(&o))
	for _, op := range []struct {
		use, short, verb string
		f                func(*cobra.Command, *pgx.Conn, string) error
	}{
		{"pause", "Pause a schedule: it fires nothing until resumed", "paused",
			func(cmd *cobra.Command, c *pgx.Conn, n string) error { return schedules.Pause(cmd.Context(), c, n) }},
		{"resume", "Resume a paused schedule from its next fire time after now (no catch-up)", "resumed",
			func(cmd *cobra.Command, c *pgx.Conn, n string) error { return schedules.Resume(cmd.Context(), c, n) }},
		{"delete", "Delete a schedule (the tasks it created stay)", "deleted",
			func(cmd *cobra.Command, c *pgx.Conn, n string) error { return schedules.Delete(cmd.Context(), c, n) }},
	} {
		cmd.AddCommand(&cobra.Command{
			Use:     op.use + " NAME",
			Short:   op.short,
			Example: fmt.Sprintf("  scheduler schedule %s nightly", op.use),
			Args:    usageArgs(cobra.ExactArgs(1)),
			RunE: func(cmd *cobra.Command, args []string) error {
				return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
					if err := op.f(cmd, conn, args[0]); err != nil {
						return scheduleError(err)
					}
					if format == outputJSON {
						return writeJSON(cmd.OutOrStdout(), map[string]any{"name": args[0], op.verb: true})
					}
					fmt.Fprintf(cmd.OutOrStdout(), "schedule %s %s\n", termSafe(args[0]), op.verb)
					return nil
				})
			},
		})
	}
	return cmd
}

// scheduleError makes a validation failure or an unknown name a plain refusal.
func scheduleError(err error) error {
	if errors.Is(err, schedules.ErrInvalid) {
		return usageError{err}
	}
	return err
}

func newScheduleCreateCommand(o *dbOptions) *cobra.Command {
	var d schedules.Definition
	var contextArg string
	cmd := &cobra.Command{
		Use:   "create NAME --template T --cron EXPR",
		Short: "Create a schedule",
		Long: "Create a schedule that creates a task from template T at every fire time of EXPR: five cron fields\n" +
			"(minute hour day-of-month month day-of-week), six with seconds first, @every DURATION, or @hourly,\n" +
			"@daily, @weekly, @monthly, @yearly. The fields are read in --timezone (an IANA name; default UTC).\n" +
			"--context is merged over the template's context. --overlap skip skips a fire time while the previous\n" +
			"task of the schedule is not finished. Cron and time zone are checked here; the template when it fires.",
		Example: "  scheduler schedule create nightly --template etl --cron '30 2 * * *' --timezone Europe/Berlin\n" +
			"  scheduler schedule create poll --template poll --cron '@every 30s' --overlap skip\n" +
			"  scheduler schedule create report --template report --cron '0 0 9 * * MON' --context '{\"to\": \"ops\"}'",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			d.Name = args[0]
			if contextArg != "" {
				c, err := jsonArg("--context", contextArg)
				if err != nil {
					return err
				}
				d.Context = c
			}
			if _, err := d.Validate(); err != nil {
				return usageError{err}
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				if _, err := schedules.Put(cmd.Context(), conn, d, false); err != nil {
					return scheduleError(err)
				}
				s, err := schedules.Get(cmd.Context(), conn, d.Name)
				if err != nil {
					return err
				}
				known, err := readmodel.TemplateExists(cmd.Context(), conn, d.Template)
				if err != nil {
					return err
				}
				if !known {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: template %s does not exist (yet): each fire fails, "+
						"reported by schedule list, until it does\n", termSafe(d.Template))
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), s)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "schedule %s created: template %s, cron %q (%s), next fire %s\n",
					termSafe(s.Name), termSafe(s.Template), s.Cron, termSafe(s.Timezone), fireTime(s.NextFireAt, s.Timezone))
				return nil
			})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&d.Template, "template", "", "the task template each fire creates a task from (required)")
	fs.StringVar(&d.Cron, "cron", "", "the cron expression (required)")
	fs.StringVar(&d.Timezone, "timezone", "UTC", "the IANA time zone the cron fields are read in")
	fs.StringVar(&contextArg, "context", "", "JSON object merged over the template's context (or @FILE)")
	fs.StringVar(&d.Overlap, "overlap", schedules.OverlapAllow,
		"allow: fire every time; skip: skip a fire time while the previous task is not finished")
	_ = cmd.MarkFlagRequired("template")
	_ = cmd.MarkFlagRequired("cron")
	return cmd
}

// fireTime prints a fire time in UTC and in the schedule's zone.
func fireTime(t *time.Time, tz string) string {
	if t == nil {
		return "-"
	}
	s := t.UTC().Format(time.RFC3339)
	if loc, err := time.LoadLocation(tz); err == nil && loc != time.UTC {
		s += " (" + t.In(loc).Format("2006-01-02 15:04:05 MST") + ")"
	}
	return s
}

func newScheduleListCommand(o *dbOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Short:   "List the schedules with their next fire time, last task and last error",
		Example: "  scheduler schedule list\n  scheduler schedule list --output json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				list, err := schedules.List(cmd.Context(), conn)
				if err != nil {
					return err
				}
				if format == outputJSON {
					if list == nil {
						list = []schedules.Schedule{}
					}
					return writeJSON(cmd.OutOrStdout(), list)
				}
				now, err := readmodel.Now(cmd.Context(), conn, nil)
				if err != nil {
					return err
				}
				tw := newTable(cmd.OutOrStdout())
				fmt.Fprintln(tw, "NAME\tTEMPLATE\tCRON\tTIMEZONE\tOVERLAP\tSTATE\tNEXT FIRE\tLAST TASK\tSKIPPED\tLAST ERROR")
				for _, s := range list {
					state, next := "active", "-"
					if s.Paused {
						state = "paused"
					}
					if s.NextFireAt != nil && !s.Paused {
						next = s.NextFireAt.UTC().Format(time.RFC3339) + " (" + relative(*s.NextFireAt, now) + ")"
					}
					last := "-"
					if s.LastTaskID != nil {
						last = fmt.Sprintf("%d (%s)", *s.LastTaskID, orDash(s.LastTaskStatus))
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", termSafe(s.Name), termSafe(s.Template),
						termSafe(s.Cron), termSafe(s.Timezone), s.Overlap, state, next, last, s.SkippedCount,
						termSafePtr(s.LastError))
				}
				return tw.Flush()
			})
		},
	}
}

func newSchedulePreviewCommand(o *dbOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "preview NAME",
		Short:   "Print the next five fire times of a schedule",
		Example: "  scheduler schedule preview nightly",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				times, err := schedules.Preview(cmd.Context(), conn, args[0], 5)
				if err != nil {
					return scheduleError(err)
				}
				s, err := schedules.Get(cmd.Context(), conn, args[0])
				if err != nil {
					return err
				}
				if format == outputJSON {
					if times == nil {
						times = []time.Time{}
					}
					return writeJSON(cmd.OutOrStdout(), map[string]any{"name": s.Name, "cron": s.Cron,
						"timezone": s.Timezone, "fire_times": times})
				}
				for _, t := range times {
					fmt.Fprintln(cmd.OutOrStdout(), fireTime(&t, s.Timezone))
				}
				return nil
			})
		},
	}
}
