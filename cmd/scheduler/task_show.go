package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
)

// Inspection: `scheduler task list`, `task show` and `task events`. Readiness and the execution status come from
// step_readiness and task_execution_context; Go only lays them out.

// terminalStates are the step states no attempt follows (SPEC §5).
var terminalStates = []string{"complete", "error", "skipped", "cancelled", "resolved_manually"}

// taskStatuses are the values of tasks.status (SPEC §2), the choices of --status.
var taskStatuses = []string{"pending", "in_progress", "complete", "error", "cancelled"}

type taskRow struct {
	ID        int64     `json:"id"`
	Name      string    `json:"name"`
	Namespace string    `json:"namespace"`
	Status    string    `json:"status"`
	Paused    bool      `json:"paused"`
	Steps     int32     `json:"steps"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

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
				rows, err := tx.Query(cmd.Context(), readmodel.Query("task_list"), status, name, limit)
				if err != nil {
					return err
				}
				tasks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[taskRow])
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), append([]taskRow{}, tasks...))
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

// taskShow is what `scheduler task show` prints; its JSON form is stable.
type taskShow struct {
	taskRow
	ExecutionStatus string     `json:"execution_status"`
	NextAttemptAt   *time.Time `json:"next_attempt_at"`
	RunAt           *time.Time `json:"run_at,omitempty"` // the task's delayed start (SPEC §15), NULL: none
	AsOf            time.Time  `json:"as_of"`
	StepList        []stepShow `json:"step_list"`
}

type stepShow struct {
	ID            int64      `json:"id"`
	Name          string     `json:"name"`
	Handler       string     `json:"handler"`
	State         string     `json:"state"`
	Attempts      int32      `json:"attempts"`
	MaxAttempts   *int32     `json:"max_attempts"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	Ready         bool       `json:"ready"`
	BlockedReason *string    `json:"blocked_reason"`
	// FlowLimit is explain's message when flow control holds the step (SPEC §14): the key, and the count in
	// flight or the time of the next token.
	FlowLimit *string         `json:"flow_limit,omitempty"`
	LastError json.RawMessage `json:"last_error"`
	Parents   []string        `json:"parents"`
	depth     int
}

func newTaskShowCommand(o *dbOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "show TASK_ID",
		Short: "Show a task's steps as a tree: state, attempt a/max, next attempt, last error",
		Long: "Show a task and its steps as an indented tree (a step under its deepest parent chain, its other\n" +
			"parents listed after it): state, attempt a/max, when the next attempt may start (\"in 3.2s\"),\n" +
			"whether it is ready or why not (step_readiness), and the last error's class and message.",
		Example: "  scheduler task show 12\n  scheduler task show 12 --output json",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID("TASK_ID", args[0])
			if err != nil {
				return err
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				show, err := readTaskShow(cmd.Context(), conn, o, id)
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), show)
				}
				show.writeTable(cmd)
				return nil
			})
		},
	}
	addAsOfFlag(cmd, o)
	return cmd
}

func readTaskShow(ctx context.Context, conn *pgx.Conn, o *dbOptions, id int64) (*taskShow, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	now, err := o.dbNow(ctx, tx)
	if err != nil {
		return nil, err
	}
	show := &taskShow{AsOf: now, StepList: []stepShow{}}
	err = tx.QueryRow(ctx, readmodel.Query("task_show_header"), id, now).
		Scan(&show.ID, &show.Name, &show.Namespace, &show.Status, &show.Paused, &show.Steps, &show.CreatedAt,
			&show.UpdatedAt, &show.ExecutionStatus, &show.NextAttemptAt, &show.RunAt)
	if err == pgx.ErrNoRows {
		return nil, fmt.Errorf("task %d does not exist", id)
	} else if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, readmodel.Query("task_show_steps"), id, now)
	if err != nil {
		return nil, err
	}
	var s stepShow
	_, err = pgx.ForEachRow(rows, []any{&s.ID, &s.Name, &s.Handler, &s.State, &s.Attempts, &s.MaxAttempts,
		&s.NextAttemptAt, &s.Ready, &s.BlockedReason, &s.FlowLimit, &s.LastError, &s.Parents}, func() error {
		if s.Parents == nil {
			s.Parents = []string{}
		}
		show.StepList = append(show.StepList, s)
		s = stepShow{}
		return nil
	})
	if err != nil {
		return nil, err
	}
	show.StepList = treeOrder(show.StepList)
	return show, nil
}

// treeOrder orders steps depth first from the roots: each step comes after its last parent (by position),
// indented one level deeper than that parent. Steps without parents are roots, in id order.
func treeOrder(steps []stepShow) []stepShow {
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
	out := make([]stepShow, 0, len(steps))
	var walk func(i, depth int)
	walk = func(i, depth int) {
		s := steps[i]
		s.depth = depth
		out = append(out, s)
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
	fmt.Fprintln(tw, "STEP\tID\tSTATE\tATTEMPT\tNEXT ATTEMPT\tREADY\tLAST ERROR")
	for _, s := range t.StepList {
		name := strings.Repeat("  ", s.depth) + termSafe(s.Name)
		if len(s.Parents) > 1 {
			name += " (after " + termSafe(strings.Join(s.Parents, ", ")) + ")"
		}
		next := "-"
		if s.NextAttemptAt != nil && (s.State == "pending" || s.State == "waiting_for_retry") {
			next = relative(*s.NextAttemptAt, t.AsOf)
			if !s.NextAttemptAt.After(t.AsOf) {
				next = "due"
			}
		}
		ready := "yes"
		switch {
		case slices.Contains(terminalStates, s.State):
			ready = "-" // finished: readiness no longer applies
		case s.FlowLimit != nil:
			ready = termSafe(*s.FlowLimit) // names the key: "concurrency limited by tenant:7: 2 of 2 in flight"
		case !s.Ready:
			ready = orDash(s.BlockedReason)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d/%s\t%s\t%s\t%s\n", name, s.ID, s.State, s.Attempts, orDash(s.MaxAttempts),
			next, ready, lastError(s.LastError))
	}
	_ = tw.Flush()
}

// lastError prints "class: message" of a last_error document, or "-".
func lastError(doc json.RawMessage) string {
	var e struct {
		Class   string `json:"class"`
		Message string `json:"message"`
	}
	if len(doc) == 0 || json.Unmarshal(doc, &e) != nil || (e.Class == "" && e.Message == "") {
		return "-"
	}
	msg := strings.Join(strings.Fields(e.Message), " ")
	if len(msg) > 80 {
		msg = strings.ToValidUTF8(msg[:77], "") + "..."
	}
	return termSafe(strings.TrimSuffix(e.Class+": "+msg, ": "))
}

type eventRow struct {
	ID        int64           `json:"id"`
	At        time.Time       `json:"at"`
	StepID    *int64          `json:"step_id"`
	StepName  *string         `json:"step_name"`
	Attempt   *int32          `json:"attempt"`
	Iteration *int32          `json:"iteration"`
	Event     string          `json:"event"`
	FromState *string         `json:"from_state"`
	ToState   *string         `json:"to_state"`
	Details   json.RawMessage `json:"details"`
	atText    string
}

func newTaskEventsCommand(o *dbOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "events TASK_ID",
		Short: "Print the task's step_events timeline, oldest first",
		Long: "Print the task's history (stepready.step_events), oldest first: time (in the database session's time\n" +
			"zone), step, attempt, event, state change and details (error, class, chosen delay, jitter sample…).",
		Example: "  scheduler task events 12\n  scheduler task events 12 --output json",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID("TASK_ID", args[0])
			if err != nil {
				return err
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				var exists bool
				if err := conn.QueryRow(cmd.Context(), readmodel.Query("task_exists"), id).Scan(&exists); err != nil {
					return err
				}
				if !exists {
					return fmt.Errorf("task %d does not exist", id)
				}
				rows, err := conn.Query(cmd.Context(), readmodel.Query("task_timeline"), id)
				if err != nil {
					return err
				}
				events := []eventRow{}
				var e eventRow
				_, err = pgx.ForEachRow(rows, []any{&e.ID, &e.At, &e.StepID, &e.StepName, &e.Attempt, &e.Iteration,
					&e.Event, &e.FromState, &e.ToState, &e.Details, &e.atText}, func() error {
					events = append(events, e)
					e = eventRow{}
					return nil
				})
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
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.atText, termSafePtr(e.StepName), orDash(e.Attempt), e.Event,
						change, termSafe(details))
				}
				return tw.Flush()
			})
		},
	}
	return cmd
}
