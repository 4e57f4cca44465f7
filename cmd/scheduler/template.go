package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
	"github.com/stepready/stepready/internal/templates"
)

// newTemplateCommand builds `scheduler template`: apply and list task templates (SPEC §10).
func newTemplateCommand(_ *globalOptions) *cobra.Command {
	var o dbOptions
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Define task templates from YAML files and list them",
	}
	addDBFlags(cmd, &o)

	apply := &cobra.Command{
		Use:   "apply FILE...",
		Short: "Store task templates from YAML files (upsert by name and version)",
		Long: "Store task templates from YAML files: each file holds one task definition (its fields:\n" +
			"docs/functions.md, \"Task definition JSON\") plus an optional `version` (default 1). Every file is read\n" +
			"and checked first (malformed YAML, unknown keys with their line), then all are stored in one transaction,\n" +
			"where the database validates each definition (names, dependencies, cycles, presets, numbers, backoff): one\n" +
			"invalid file stores nothing. A template with the same name and version is replaced.",
		Example: "  scheduler template apply examples/flaky.yaml\n" +
			"  scheduler template apply templates/*.yaml --output json",
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			ts, err := readTemplates(args)
			if err != nil {
				return err
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				applied, err := templates.Apply(cmd.Context(), conn, ts)
				if err != nil {
					return err
				}
				type schedRow struct {
					Name    string `json:"name"`
					Created bool   `json:"created"`
				}
				type row struct {
					Name      string     `json:"name"`
					Version   int        `json:"version"`
					File      string     `json:"file"`
					Created   bool       `json:"created"`
					Schedules []schedRow `json:"schedules,omitempty"`
				}
				rows := make([]row, 0, len(applied))
				for _, a := range applied {
					r := row{Name: a.Name, Version: a.Version, File: a.File, Created: a.Created}
					for i, d := range a.Template.Schedules {
						r.Schedules = append(r.Schedules, schedRow{d.Name, a.SchedulesCreated[i]})
					}
					rows = append(rows, r)
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), rows)
				}
				for _, r := range rows {
					verb := "replaced"
					if r.Created {
						verb = "created"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "template %s version %d %s (%s)\n", termSafe(r.Name), r.Version, verb,
						termSafe(r.File))
					for _, sr := range r.Schedules {
						verb := "replaced"
						if sr.Created {
							verb = "created"
						}
						fmt.Fprintf(cmd.OutOrStdout(), "schedule %s %s (%s)\n", termSafe(sr.Name), verb, termSafe(r.File))
					}
				}
				return nil
			})
		},
	}

	list := &cobra.Command{
		Use:     "list",
		Short:   "List the stored task templates",
		Example: "  scheduler template list\n  scheduler template list --output json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				out, err := readmodel.Templates(cmd.Context(), conn)
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), out)
				}
				tw := newTable(cmd.OutOrStdout())
				fmt.Fprintln(tw, "NAME\tVERSION\tSTEPS\tNEWEST")
				for _, r := range out {
					newest := ""
					if r.Newest {
						newest = "yes"
					}
					fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", termSafe(r.Name), r.Version, r.Steps, newest)
				}
				return tw.Flush()
			})
		},
	}
	cmd.AddCommand(apply, list)
	return cmd
}

// readTemplates parses every file (all of them, reporting every error) and refuses two files with the same
// name and version.
func readTemplates(files []string) ([]templates.Template, error) {
	var (
		ts   []templates.Template
		errs []error
	)
	seen := map[string]string{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		t, err := templates.Parse(file, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		key := fmt.Sprintf("%s version %d", t.Name, t.Version)
		if other, ok := seen[key]; ok {
			errs = append(errs, fmt.Errorf("%s and %s both define template %s", other, file, key))
			continue
		}
		seen[key] = file
		ts = append(ts, t)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("nothing applied: %w", errors.Join(errs...))
	}
	return ts, nil
}
