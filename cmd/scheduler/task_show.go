package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
)

// Inspection of one task: `scheduler task show` (`task list` is in task_list.go, `task events` in
// task_events.go). Readiness and the execution status come from step_readiness and task_execution_context, through
// internal/readmodel; Go only lays them out.

// terminalStates are the step states no attempt follows (SPEC §5).
var terminalStates = []string{"complete", "error", "skipped", "cancelled", "resolved_manually"}

// taskShow is what `scheduler task show` prints: the read model's task detail (its JSON form), and the steps
// laid out as a tree for the table.
type taskShow struct {
	*readmodel.TaskDetail
	tree []treeStep
	// elements are the elements of each map step, in element order; the table lists them only with --elements,
	// up to elementsLimit of each.
	elements      map[int64][]readmodel.Step
	listElements  bool
	elementsLimit int
}

// treeStep is a step with its depth in the tree.
type treeStep struct {
	readmodel.Step
	depth int
}

func newTaskShowCommand(o *dbOptions) *cobra.Command {
	var listElements bool
	var elementsLimit int
	cmd := &cobra.Command{
		Use:   "show TASK_ID",
		Short: "Show a task's steps as a tree: state, attempt a/max, next attempt, last error",
		Long: "Show a task and its steps as an indented tree (a step under its deepest parent chain, its other\n" +
			"parents listed after it): state, attempt a/max, when the next attempt may start (\"in 3.2s\"),\n" +
			"whether it is ready or why not (step_readiness's first reason, in explain's words), and the last\n" +
			"error's class and message. The heading names the task's execution status (task_execution_context).\n" +
			"A map step is one row with its progress (\"12/100 complete, 3 in flight, 1 failed\"); --elements lists\n" +
			"its elements under it, the first --elements-limit of each. --output json lists every step, elements\n" +
			"included (map_step_id, element_index), and a map step's counts under \"map\".",
		Example: "  scheduler task show 12\n  scheduler task show 12 --elements\n  scheduler task show 12 --output json",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID("TASK_ID", args[0])
			if err != nil {
				return err
			}
			if elementsLimit < 1 {
				return usagef("--elements-limit %d: must be 1 or more", elementsLimit)
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				show, err := readTaskShow(cmd.Context(), conn, o, id)
				if err != nil {
					return err
				}
				show.listElements, show.elementsLimit = listElements, elementsLimit
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), show)
				}
				show.writeTable(cmd)
				return nil
			})
		},
	}
	addAsOfFlag(cmd, o)
	cmd.Flags().BoolVar(&listElements, "elements", false, "list the elements of map steps under them")
	cmd.Flags().IntVar(&elementsLimit, "elements-limit", 50, "with --elements, how many elements of each map step to list")
	return cmd
}

func readTaskShow(ctx context.Context, conn *pgx.Conn, o *dbOptions, id int64) (*taskShow, error) {
	asOf, err := o.asOfTime()
	if err != nil {
		return nil, err
	}
	d, err := readmodel.ReadTask(ctx, conn, id, readmodel.TaskOptions{AsOf: asOf})
	if err != nil {
		return nil, err
	}
	// Elements stand under their map step (which stands for them in the tree), in element order.
	steps := make([]readmodel.Step, 0, len(d.StepList))
	elements := map[int64][]readmodel.Step{}
	for _, s := range d.StepList {
		if s.IsElement() {
			elements[*s.MapStepID] = append(elements[*s.MapStepID], s)
			continue
		}
		steps = append(steps, s)
	}
	for _, e := range elements {
		slices.SortFunc(e, func(a, b readmodel.Step) int { return cmp.Compare(*a.ElementIndex, *b.ElementIndex) })
	}
	return &taskShow{TaskDetail: d, tree: treeOrder(steps), elements: elements}, nil
}

// treeOrder orders steps depth first from the roots: each step comes after its last parent (by position),
// indented one level deeper than that parent. Steps without parents are roots, in id order.
func treeOrder(steps []readmodel.Step) []treeStep {
	byName := map[string]int{}
	for i, s := range steps {
		byName[s.Name] = i
	}
	// The tree parent of a step is its parent with the greatest id; the DAG's other edges are listed.
	children := map[int][]int{}
	var roots []int
	for i, s := range steps {
		if len(s.Parents) == 0 {
			roots = append(roots, i)
			continue
		}
		p := -1
		for _, name := range s.Parents {
			if j, ok := byName[name]; ok && (p < 0 || steps[j].ID > steps[p].ID) {
				p = j
			}
		}
		children[p] = append(children[p], i)
	}
	out := make([]treeStep, 0, len(steps))
	var walk func(i, depth int)
	walk = func(i, depth int) {
		out = append(out, treeStep{Step: steps[i], depth: depth})
		for _, c := range children[i] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	return out
}

func (t *taskShow) writeTable(cmd *cobra.Command) {
	out := cmd.OutOrStdout()
	paused := ""
	if t.Paused {
		paused = ", paused"
	}
	fmt.Fprintf(out, "task %d %q (%s%s): %s\n", t.ID, t.Name, t.Status, paused, t.ExecutionStatus)
	fmt.Fprintf(out, "namespace %s · created %s · updated %s", termSafe(t.Namespace), relative(t.CreatedAt, t.AsOf),
		relative(t.UpdatedAt, t.AsOf))
	if t.RunAt != nil && t.RunAt.After(t.AsOf) {
		fmt.Fprintf(out, " · scheduled: starts at %s (%s)", t.RunAt.UTC().Format(time.RFC3339), relative(*t.RunAt, t.AsOf))
	} else if t.NextAttemptAt != nil {
		fmt.Fprintf(out, " · next attempt %s", relative(*t.NextAttemptAt, t.AsOf))
	}
	fmt.Fprintln(out)
	tw := newTable(out)
	fmt.Fprintln(tw, "STEP\tID\tSTATE\tATTEMPT\tNEXT ATTEMPT\tREADY\tLAST ERROR\tOUTPUT")
	for _, s := range t.tree {
		name := strings.Repeat("  ", s.depth) + termSafe(s.Name)
		if len(s.Parents) > 1 {
			name += " (after " + termSafe(strings.Join(s.Parents, ", ")) + ")"
		}
		t.writeStep(tw, name, s.Step)
		if t.listElements && s.Map != nil {
			t.writeElements(tw, s)
		}
	}
	_ = tw.Flush()
}

// writeElements lists the first elementsLimit elements of map step m under it, in element order, and how many
// more there are.
func (t *taskShow) writeElements(tw io.Writer, m treeStep) {
	indent := strings.Repeat("  ", m.depth+1)
	elements := t.elements[m.ID]
	for i, e := range elements {
		if i == t.elementsLimit {
			// The rest are counted, not listed: --elements-limit lists more, --output json all of them.
			fmt.Fprintf(tw, "%s… %d more\t-\t-\t-\t-\t-\t-\t-\n", indent, len(elements)-i)
			return
		}
		t.writeStep(tw, indent+termSafe(e.Name), e)
	}
}

// writeStep writes step s's row of the steps table under the name cell name.
func (t *taskShow) writeStep(tw io.Writer, name string, s readmodel.Step) {
	// Only a wait still to come is a next attempt (a past next_attempt_at is no wait: the step is ready, or
	// waits for something else, said in READY).
	next := "-"
	if s.NextAttemptAt != nil && s.NextAttemptAt.After(t.AsOf) && (s.State == "pending" || s.State == "waiting_for_retry") {
		next = relative(*s.NextAttemptAt, t.AsOf)
	}
	ready := "yes"
	switch {
	case s.Map != nil && s.Map.FannedOut:
		ready = mapProgress(s.Map) // a map step's progress, whatever its state
	case slices.Contains(terminalStates, s.State):
		ready = "-" // finished: readiness no longer applies
	case !s.Ready:
		// explain's words for the first reason, as the console and `scheduler explain` print them ("backoff
		// until 12:00:03 (in 1.8s)", "rate limited by api:partner: next slot in 0.8s"); the reason itself is
		// blocked_reason in the JSON.
		ready = termSafe(cmp.Or(s.Why, orDash(s.BlockedReason)))
	}
	fmt.Fprintf(tw, "%s\t%d\t%s\t%d/%s\t%s\t%s\t%s\t%s\n", name, s.ID, s.State, s.Attempts, orDash(s.MaxAttempts),
		next, ready, lastError(s), outputCell(s.Output))
}

// mapProgress is a map step's progress as the steps table shows it: "12/100 complete, 3 in flight, 1 failed".
func mapProgress(m *readmodel.MapProgress) string {
	return fmt.Sprintf("%d/%d complete, %d in flight, %d failed", m.Done, m.Total, m.InFlight, m.Failed)
}

// outputCell is a step's output in the steps table: its JSON on one line, cut at 40 characters ("-" for none).
// `task show --output json` and `step show` print it whole.
func outputCell(doc json.RawMessage) string {
	if len(doc) == 0 || string(doc) == "null" {
		return "-"
	}
	r := []rune(string(doc))
	if len(r) > 40 {
		return termSafe(string(r[:37])) + "..."
	}
	return termSafe(string(r))
}

// lastError prints the step's last error as every face does (readmodel.Step.LastErrorText), shortened for a
// table, or "-".
func lastError(s readmodel.Step) string {
	msg := s.LastErrorText()
	if msg == "" {
		return "-"
	}
	if len(msg) > 80 {
		msg = strings.ToValidUTF8(msg[:77], "") + "..."
	}
	return termSafe(msg)
}
