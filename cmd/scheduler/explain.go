package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
)

// newExplainCommand builds `scheduler explain`: why each step of a task (or one step) is not ready, every
// reason in plain words, as stepready.explain_task / explain_step return them.
func newExplainCommand(_ *globalOptions) *cobra.Command {
	var (
		o    dbOptions
		step bool
	)
	cmd := &cobra.Command{
		Use:   "explain TASK_ID | --step STEP_ID | --step TASK_ID/STEP_NAME",
		Short: "Say why steps are not ready: every reason, in plain words",
		Long: "Print every step of a task (or, with --step, one step) with every reason it may not start now, in\n" +
			"the precedence order of step_readiness (the first reason is its blocked_reason): task not active, task\n" +
			"paused, scheduled (run_at), terminal, in flight, each unsatisfied parent, not retryable, retries\n" +
			"exhausted, backoff. A ready\n" +
			"step says \"ready\". Times are relative to the database's clock (or --as-of).",
		Example: "  scheduler explain 12\n" +
			"  scheduler explain --step 34\n" +
			"  scheduler explain --step 12/fetch\n" +
			"  scheduler explain 12 --output json\n" +
			"  scheduler explain 12 --as-of 2030-01-01T12:00:00Z",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var (
				id  int64
				ref stepRef
				err error
			)
			if step {
				ref, err = parseStepRef(args[0])
			} else {
				id, err = parseID("TASK_ID", args[0])
			}
			if err != nil {
				return err
			}
			return o.withConn(cmd.Context(), func(conn *pgx.Conn, format string) error {
				if step {
					if id, err = ref.resolve(cmd.Context(), conn); err != nil {
						return err
					}
				}
				report, err := explain(cmd.Context(), conn, &o, id, step)
				if err != nil {
					return err
				}
				if format == outputJSON {
					return writeJSON(cmd.OutOrStdout(), report)
				}
				return report.writeTable(cmd)
			})
		},
	}
	addDBFlags(cmd, &o)
	addAsOfFlag(cmd, &o)
	cmd.Flags().BoolVar(&step, "step", false, "the argument is a step (STEP_ID or TASK_ID/STEP_NAME): explain that step only")
	return cmd
}

// explainReport is what `scheduler explain` prints; its JSON form is stable.
type explainReport struct {
	TaskID     int64         `json:"task_id"`
	TaskName   string        `json:"task_name"`
	TaskStatus string        `json:"task_status"`
	TaskPaused bool          `json:"task_paused"`
	AsOf       time.Time     `json:"as_of"`
	Steps      []explainStep `json:"steps"`
}

type explainStep struct {
	StepID      int64           `json:"step_id"`
	Name        string          `json:"name"`
	State       string          `json:"state"`
	Attempts    int32           `json:"attempts"`
	MaxAttempts *int32          `json:"max_attempts"`
	Ready       bool            `json:"ready"`
	Reasons     []explainReason `json:"reasons"`
}

type explainReason struct {
	Reason            string     `json:"reason"`
	Message           string     `json:"message"`
	ParentStepID      *int64     `json:"parent_step_id,omitempty"`
	ParentName        *string    `json:"parent_name,omitempty"`
	ParentState       *string    `json:"parent_state,omitempty"`
	ParentAttempts    *int32     `json:"parent_attempts,omitempty"`
	ParentMaxAttempts *int32     `json:"parent_max_attempts,omitempty"`
	NextAttemptAt     *time.Time `json:"next_attempt_at,omitempty"`
	WaitMs            *int64     `json:"wait_ms,omitempty"`
}

// explain reads the task (of the step), its steps' readiness and every reason, in one snapshot.
func explain(ctx context.Context, conn *pgx.Conn, o *dbOptions, id int64, isStep bool) (*explainReport, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	asOf, err := o.dbNow(ctx, tx)
	if err != nil {
		return nil, err
	}
	r := &explainReport{AsOf: asOf, Steps: []explainStep{}}
	taskID := id
	var stepIDs []int64
	if isStep {
		if err := tx.QueryRow(ctx, readmodel.Query("step_task"), id).Scan(&taskID); err != nil {
			if err == pgx.ErrNoRows {
				return nil, fmt.Errorf("step %d does not exist", id)
			}
			return nil, err
		}
		stepIDs = []int64{id}
	}
	err = tx.QueryRow(ctx, readmodel.Query("explain_task_row"), taskID).
		Scan(&r.TaskID, &r.TaskName, &r.TaskStatus, &r.TaskPaused)
	if err == pgx.ErrNoRows {
		return nil, fmt.Errorf("task %d does not exist", taskID)
	} else if err != nil {
		return nil, err
	}

	rows, err := tx.Query(ctx, readmodel.Query("explain_readiness"), taskID, stepIDs, asOf)
	if err != nil {
		return nil, err
	}
	index := map[int64]int{}
	var s explainStep
	_, err = pgx.ForEachRow(rows, []any{&s.StepID, &s.Name, &s.State, &s.Attempts, &s.MaxAttempts, &s.Ready},
		func() error {
			s.Reasons = []explainReason{}
			index[s.StepID] = len(r.Steps)
			r.Steps = append(r.Steps, s)
			s = explainStep{}
			return nil
		})
	if err != nil {
		return nil, err
	}

	query := readmodel.Query("explain_reasons_task")
	if isStep {
		query = readmodel.Query("explain_reasons_step")
	}
	rows, err = tx.Query(ctx, query, id, asOf)
	if err != nil {
		return nil, err
	}
	var (
		stepID int64
		e      explainReason
	)
	_, err = pgx.ForEachRow(rows, []any{&stepID, &e.Reason, &e.Message, &e.ParentStepID, &e.ParentName,
		&e.ParentState, &e.ParentAttempts, &e.ParentMaxAttempts, &e.NextAttemptAt, &e.WaitMs}, func() error {
		if i, ok := index[stepID]; ok {
			r.Steps[i].Reasons = append(r.Steps[i].Reasons, e)
		}
		e = explainReason{}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// writeTable prints one line per reason: STEP NAME STATE ATTEMPT REASON.
func (r *explainReport) writeTable(cmd *cobra.Command) error {
	out := cmd.OutOrStdout()
	paused := ""
	if r.TaskPaused {
		paused = ", paused"
	}
	fmt.Fprintf(out, "task %d %q (%s%s)\n", r.TaskID, r.TaskName, r.TaskStatus, paused)
	tw := newTable(out)
	fmt.Fprintln(tw, "STEP\tNAME\tSTATE\tATTEMPT\tWHY NOT READY")
	for _, s := range r.Steps {
		attempt := fmt.Sprintf("%d/%s", s.Attempts, orDash(s.MaxAttempts))
		if s.Ready {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", s.StepID, termSafe(s.Name), s.State, attempt, "ready")
			continue
		}
		for i, e := range s.Reasons {
			if i == 0 {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", s.StepID, termSafe(s.Name), s.State, attempt, termSafe(e.Message))
			} else {
				fmt.Fprintf(tw, "\t\t\t\t%s\n", termSafe(e.Message))
			}
		}
	}
	return tw.Flush()
}
