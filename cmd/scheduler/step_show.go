package main

import (
	"encoding/json"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
)

// stepShowMaxChars is how much of each JSON document `step show` prints in its table form; --output json prints
// them whole.
const stepShowMaxChars = 400

// newStepShowCommand builds `scheduler step show`: one step with its input as defined and as resolved now, its
// deps and its output (SPEC §18).
func newStepShowCommand(o *dbOptions) *cobra.Command {
	show := &cobra.Command{
		Use:   "show STEP_ID | TASK_ID/STEP_NAME",
		Short: "Show one step: its state, input (as defined and resolved), deps and output",
		Long: "Show one step (read in one snapshot): its state and attempts, its input as defined and as its next\n" +
			"attempt would receive it now (references ${deps.…}, ${context.…}, ${task.id} resolved against its\n" +
			"deps and the task's context, or why they do not resolve yet), its deps (the outputs of its direct\n" +
			"parents, by name) and its output. Documents longer than 400 characters are truncated; --output json\n" +
			"prints them whole.",
		Example: "  scheduler step show 34\n  scheduler step show 12/report --output json",
		Args:    usageArgs(cobra.ExactArgs(1)),
	}
	show.Flags().StringVarP(&o.output, "output", "o", outputTable,
		"output format: table (for people) or json (stable, for scripts)")
	show.RunE = func(cmd *cobra.Command, args []string) error {
		ref, err := parseStepRef(args[0])
		if err != nil {
			return err
		}
		return o.withStep(cmd.Context(), ref, func(conn *pgx.Conn, id int64, format string) error {
			taskID, err := readmodel.StepTask(cmd.Context(), conn, id)
			if err != nil {
				return err
			}
			d, err := readmodel.ReadStep(cmd.Context(), conn, taskID, id, nil)
			if err != nil {
				return err
			}
			if format == outputJSON {
				return writeJSON(cmd.OutOrStdout(), d)
			}
			writeStepShow(cmd.OutOrStdout(), d)
			return nil
		})
	}
	return show
}

func writeStepShow(out io.Writer, d *readmodel.StepDetail) {
	fmt.Fprintf(out, "step %d %q (task %d), handler %s\n", d.ID, d.Name, d.TaskID, d.Handler)
	attempts := fmt.Sprintf("%d", d.Step.Attempts)
	if d.MaxAttempts != nil {
		attempts += fmt.Sprintf("/%d", *d.MaxAttempts)
	}
	fmt.Fprintf(out, "state: %s, attempt %s, iteration %d\n", d.State, attempts, d.Iteration)
	if e := d.LastErrorText(); e != "" {
		fmt.Fprintf(out, "last error: %s\n", e)
	}
	fmt.Fprintf(out, "input: %s\n", clipJSON(d.Input))
	switch {
	case d.InputProblem != nil:
		fmt.Fprintf(out, "input resolved now: does not resolve yet: %s\n", *d.InputProblem)
	case string(d.ResolvedInput) != string(d.Input):
		fmt.Fprintf(out, "input resolved now: %s\n", clipJSON(d.ResolvedInput))
	}
	fmt.Fprintf(out, "deps: %s\n", clipJSON(d.Deps))
	fmt.Fprintf(out, "output: %s\n", clipJSON(d.Output))
}

// clipJSON is a JSON document on one line, cut at stepShowMaxChars characters with the full size said; "-" for
// none.
func clipJSON(doc json.RawMessage) string {
	if len(doc) == 0 || string(doc) == "null" {
		return "-"
	}
	s := string(doc)
	if utf8.RuneCountInString(s) <= stepShowMaxChars {
		return s
	}
	r := []rune(s)
	return fmt.Sprintf("%s… (%d bytes; --output json for all of it)", string(r[:stepShowMaxChars]), len(doc))
}
