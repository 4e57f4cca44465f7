// Package demo prints the live account of `scheduler demo`: it tails stepready.step_events and writes one
// readable line per thing that happened (an attempt started, failed with its class and the retry delay the
// policy chose, a step completed or skipped, a task finished), then a summary once the demo's tasks are done.
//
// It only reads: everything it shows was decided and recorded by the SQL functions of the stepready schema.
package demo

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/readmodel"
)

var (
	//go:embed sql/task_status.sql
	taskStatusSQL string
	//go:embed sql/summary.sql
	summarySQL string
)

const (
	// IntervalDefault is how often the account polls for new events.
	IntervalDefault = 100 * time.Millisecond

	// gapWait is how long an event id below one already read may stay missing (its transaction has not
	// committed yet) before the account stops waiting for it (it was rolled back).
	gapWait = 2 * time.Second

	// timeLayout formats event times.
	timeLayout = "15:04:05.000"

	// maxMessage bounds the error message shown in a line.
	maxMessage = 120
)

// Task is a task whose progress the account follows.
type Task struct {
	ID   int64
	Name string
}

// Label is how lines name the task: name#id.
func (t Task) Label() string { return fmt.Sprintf("%s#%d", t.Name, t.ID) }

// Options configure an Account.
type Options struct {
	// Interval is the poll interval (default IntervalDefault).
	Interval time.Duration
	// Location is the time zone of the printed times (default time.Local).
	Location *time.Location
}

// Account tails the events of a database and prints them. Create it with NewAccount before creating the tasks
// it should show.
type Account struct {
	pool     *pgxpool.Pool
	out      io.Writer
	interval time.Duration
	loc      *time.Location

	cursor  *readmodel.EventCursor
	tasks   map[int64]*taskState // every task seen in an event, and the watched ones
	started time.Time

	taskWidth, stepWidth int
}

// taskState is what the account knows of one task.
type taskState struct {
	Task
	status   string
	lastAt   time.Time // sort time of its latest event: its time, or the one before it if that was later
	reported bool      // its terminal status was printed
	watched  bool
}

// NewAccount returns an account that prints the events recorded from now on.
func NewAccount(ctx context.Context, pool *pgxpool.Pool, out io.Writer, opts Options) (*Account, error) {
	a := &Account{pool: pool, out: out, interval: opts.Interval, loc: opts.Location, tasks: map[int64]*taskState{},
		started: time.Now(), taskWidth: 12, stepWidth: 13}
	if a.interval <= 0 {
		a.interval = IntervalDefault
	}
	if a.loc == nil {
		a.loc = time.Local
	}
	var err error
	if a.cursor, err = readmodel.NewEventCursor(ctx, pool); err != nil {
		return nil, fmt.Errorf("demo: read the last event: %w", err)
	}
	a.cursor.GapWait = gapWait
	return a, nil
}

// Watch prints events until every task of tasks is terminal (complete, error or cancelled), then prints the
// summary and returns nil. It returns ctx's error if ctx ends first.
func (a *Account) Watch(ctx context.Context, tasks []Task) error {
	ids := make([]int64, 0, len(tasks))
	for _, t := range tasks {
		a.track(t).watched = true
		a.taskWidth = max(a.taskWidth, len(t.Label()))
		ids = append(ids, t.ID)
	}
	return a.loop(ctx, func() (bool, error) {
		for _, id := range ids {
			if !terminal(a.tasks[id].status) {
				return false, nil
			}
		}
		return true, a.summary(ctx, ids)
	})
}

// Follow prints events until ctx ends; it returns nil then.
func (a *Account) Follow(ctx context.Context) error {
	err := a.loop(ctx, func() (bool, error) { return false, nil })
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// loop polls every interval until done reports true, ctx ends or a query fails.
func (a *Account) loop(ctx context.Context, done func() (bool, error)) error {
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		if err := a.poll(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if ok, err := done(); ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (a *Account) track(t Task) *taskState {
	s, ok := a.tasks[t.ID]
	if !ok {
		s = &taskState{Task: t}
		a.tasks[t.ID] = s
	}
	return s
}

// poll reads the statuses of the known tasks, then the new events; prints the events, then the tasks that
// became terminal.
func (a *Account) poll(ctx context.Context) error {
	ids := make([]int64, 0, len(a.tasks))
	for id := range a.tasks {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	type status struct {
		id          int64
		status      string
		completedAt *time.Time
	}
	var statuses []status
	if len(ids) > 0 {
		rows, err := a.pool.Query(ctx, taskStatusSQL, ids)
		if err != nil {
			return fmt.Errorf("demo: read task statuses: %w", err)
		}
		for rows.Next() {
			var s status
			var name string
			if err := rows.Scan(&s.id, &name, &s.status, &s.completedAt); err != nil {
				rows.Close()
				return fmt.Errorf("demo: read task statuses: %w", err)
			}
			statuses = append(statuses, s)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("demo: read task statuses: %w", err)
		}
	}

	events, err := a.readEvents(ctx)
	if err != nil {
		return err
	}
	// The lines of one round are printed in time order: ids follow inserts, and times are each transaction's
	// start, so the two orders differ when attempts run in parallel.
	// Within one task, though, id order is the order things happened in (a child is claimed after its parent's
	// completion is committed), and times need not follow it: a transaction's time is its start, and a claim may
	// start just before the completion it then sees commits. A line therefore never sorts before an earlier event
	// of its own task (events are read in id order); it still shows its own time.
	var lines []line
	for _, e := range events {
		st := a.track(Task{ID: e.TaskID, Name: e.Task})
		key := later(e.At, st.lastAt)
		st.lastAt = key
		if text, ok := e.describe(); ok {
			lines = append(lines, line{at: key, text: a.format(e.At, st.Label(), deref(e.Step), text)})
		}
	}
	for _, s := range statuses {
		st := a.tasks[s.id]
		st.status = s.status
		switch {
		case terminal(s.status) && !st.reported:
			st.reported = true
			at := st.lastAt
			if s.completedAt != nil {
				at = *s.completedAt
			}
			if at.IsZero() {
				at = time.Now()
			}
			lines = append(lines, line{at: later(at, st.lastAt), // after the task's last event, as above
				text: fmt.Sprintf("%s  task %s %s", at.In(a.loc).Format(timeLayout), st.Label(), s.status)})
		case !terminal(s.status):
			st.reported = false // reset by an operator: report it again when it ends
		}
	}
	slices.SortStableFunc(lines, func(x, y line) int { return x.at.Compare(y.at) })
	for _, l := range lines {
		fmt.Fprintln(a.out, l.text)
	}
	return nil
}

// later returns the later of two times.
func later(x, y time.Time) time.Time {
	if x.Before(y) {
		return y
	}
	return x
}

// line is one line of the account.
type line struct {
	at   time.Time
	text string
}

func (a *Account) readEvents(ctx context.Context) ([]event, error) {
	read, err := a.cursor.Poll(ctx, a.pool, 1000, time.Now())
	if err != nil {
		return nil, fmt.Errorf("demo: read events: %w", err)
	}
	events := make([]event, len(read))
	for i, r := range read {
		e := event{ID: r.ID, At: r.At, TaskID: r.TaskID, Task: r.TaskName, Step: r.StepName, Event: r.Event,
			ToState: r.ToState}
		if r.Attempt != nil {
			e.Attempt = new(int(*r.Attempt))
		}
		if r.Iteration != nil {
			e.Iteration = new(int(*r.Iteration))
		}
		// Details are informative: an unexpected shape leaves the fields empty rather than stopping the demo.
		_ = json.Unmarshal(r.Details, &e.Details)
		events[i] = e
	}
	return events, nil
}

// format makes one aligned line: time, task, step, what happened.
func (a *Account) format(at time.Time, task, step, text string) string {
	a.taskWidth = max(a.taskWidth, len(task))
	a.stepWidth = max(a.stepWidth, len(step))
	return fmt.Sprintf("%s  %-*s  %-*s  %s", at.In(a.loc).Format(timeLayout), a.taskWidth, task, a.stepWidth, step, text)
}

// summary prints one line per task: its status and what became of each step.
func (a *Account) summary(ctx context.Context, ids []int64) error {
	rows, err := a.pool.Query(ctx, summarySQL, ids)
	if err != nil {
		return fmt.Errorf("demo: read the summary: %w", err)
	}
	defer rows.Close()
	type taskLine struct {
		label, status string
		steps         []string
	}
	var lines []*taskLine
	for rows.Next() {
		var (
			taskID                    int64
			task, status, step, state string
			attempts                  int
			class, reason, progress   *string
		)
		if err := rows.Scan(&taskID, &task, &status, &step, &state, &attempts, &class, &reason, &progress); err != nil {
			return fmt.Errorf("demo: read the summary: %w", err)
		}
		label := Task{ID: taskID, Name: task}.Label()
		if len(lines) == 0 || lines[len(lines)-1].label != label {
			lines = append(lines, &taskLine{label: label, status: status})
		}
		desc := step + ": " + state
		if progress != nil {
			// A map step: its elements' progress, not its own attempts.
			desc += " (" + *progress + ")"
		} else if attempts > 1 || (attempts == 1 && state != "complete") {
			desc += fmt.Sprintf(" after %d attempt%s", attempts, plural(attempts))
		}
		if class != nil && reason != nil && (state == "error" || state == "skipped") {
			desc += fmt.Sprintf(" (%s, %s)", *class, words(*reason))
		}
		lines[len(lines)-1].steps = append(lines[len(lines)-1].steps, desc)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("demo: read the summary: %w", err)
	}
	fmt.Fprintf(a.out, "\nsummary: %d task%s in %.1f s\n", len(lines), plural(len(lines)), time.Since(a.started).Seconds())
	for _, l := range lines {
		fmt.Fprintf(a.out, "  %-*s  %-8s  %s\n", a.taskWidth, l.label, l.status, strings.Join(l.steps, " · "))
	}
	return nil
}

// terminal reports whether a task status is final for the account (error and cancelled tasks can be revived by
// an operator, but nothing happens to them until then).
func terminal(status string) bool {
	return status == "complete" || status == "error" || status == "cancelled"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// words turns a reason code into words: retries_exhausted → retries exhausted.
func words(code string) string { return strings.ReplaceAll(code, "_", " ") }

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}
