package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/jackc/pgx/v5"

	"github.com/stepready/stepready/internal/readmodel"
)

// taskStatuses are the values of tasks.status, in the order the filter offers them.
var taskStatuses = []string{"pending", "in_progress", "complete", "error", "cancelled"}

type taskRow struct {
	ID               int64
	Name             string
	Namespace        string
	Status           string
	Paused           bool
	StepsTotal       int32
	StepsUnsatisfied int32
	CreatedAt        time.Time
}

type statusCount struct {
	Status string
	Count  int64
}

type tasksData struct {
	Statuses  []string
	Status    string
	Name      string
	Namespace string
	ID        string
	Tasks     []taskRow
	Counts    []statusCount
	Estimated bool
	Next      string
	Message   string
}

func (c *Console) tasksPage(w http.ResponseWriter, r *http.Request) {
	qv := r.URL.Query()
	d := tasksData{Statuses: taskStatuses, Status: qv.Get("status"), Name: qv.Get("name"),
		Namespace: qv.Get("namespace"), ID: strings.TrimSpace(qv.Get("id"))}
	if d.ID != "" {
		if id, ok := int64Param(d.ID); ok && id != nil {
			http.Redirect(w, r, fmt.Sprintf("/tasks/%d", *id), http.StatusSeeOther)
			return
		}
		d.Message = fmt.Sprintf("%q is not a task id", d.ID)
	}
	after, ok := int64Param(qv.Get("after"))
	if !ok {
		http.Error(w, "after: want a positive task id", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	rows, err := c.pool.Query(ctx, readmodel.Query("tasks"), optText(d.Status), optText(d.Name), optText(d.Namespace), after,
		pageSize+1)
	if err == nil {
		d.Tasks, err = pgx.CollectRows(rows, pgx.RowToStructByPos[taskRow])
	}
	if err != nil {
		c.fail(w, "tasks", err)
		return
	}
	if len(d.Tasks) > pageSize {
		d.Tasks = d.Tasks[:pageSize]
		next := url.Values{}
		for _, k := range []string{"status", "name", "namespace"} {
			if v := qv.Get(k); v != "" {
				next.Set(k, v)
			}
		}
		next.Set("after", strconv.FormatInt(d.Tasks[pageSize-1].ID, 10))
		d.Next = "/?" + next.Encode()
	}
	var estimate int64
	if err := c.pool.QueryRow(ctx, readmodel.Query("task_count_estimate")).Scan(&estimate); err != nil {
		c.fail(w, "task count", err)
		return
	}
	d.Estimated = estimate > estimateThreshold
	counts := readmodel.Query("status_counts")
	if d.Estimated {
		counts = readmodel.Query("status_estimates")
	}
	rows, err = c.pool.Query(ctx, counts)
	if err == nil {
		d.Counts, err = pgx.CollectRows(rows, pgx.RowToStructByPos[statusCount])
	}
	if err != nil {
		c.fail(w, "counts", err)
		return
	}
	c.render(w, r, "tasks", "Tasks", "tasks", d)
}

type taskInfo struct {
	ID          int64
	Name        string
	Namespace   string
	Status      string
	Paused      bool
	Context     string
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt *time.Time
}

type stepRow struct {
	ID            int64
	Name          string
	State         string
	Attempts      int32
	MaxAttempts   int32
	NextAttemptAt *time.Time
	LastError     *string
	Queue         string
	Handler       string
	Reason        *string
}

type eventRow struct {
	ID        int64
	StepID    *int64
	StepName  string
	Attempt   *int32
	Event     string
	FromState string
	ToState   string
	Details   string
	At        time.Time
}

type attemptRow struct {
	StepID  int64
	Attempt int32
	Started time.Time
	Ended   *time.Time
	Outcome string
	Error   string
}

// timelineBar is one attempt drawn on the task's timeline.
type timelineBar struct {
	X, Y, W int
	Label   string
	Outcome string
}

type timeline struct {
	Width, Height int
	Bars          []timelineBar
	Lanes         []timelineLane
	Span          string
}

type timelineLane struct {
	Y    int
	Name string
}

type taskData struct {
	Task     taskInfo
	Steps    []stepRow
	DAG      dagLayout
	Events   []eventRow
	Next     string
	Timeline timeline
	Now      time.Time
	Act      actionsView
}

// pathID reads path value name as a positive id, answering 404 when it is not one.
func pathID(w http.ResponseWriter, r *http.Request, name string) (int64, bool) {
	id, ok := int64Param(r.PathValue(name))
	if !ok || id == nil {
		http.NotFound(w, r)
		return 0, false
	}
	return *id, true
}

func (c *Console) taskPage(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok {
		return
	}
	before, ok := int64Param(r.URL.Query().Get("before"))
	if !ok {
		http.Error(w, "before: want a positive event id", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	var d taskData
	d.Act = c.actionsView(r)
	err := c.pool.QueryRow(ctx, `SELECT now()`).Scan(&d.Now)
	if err == nil {
		row, _ := c.pool.Query(ctx, readmodel.Query("task"), id)
		d.Task, err = pgx.CollectExactlyOneRow(row, pgx.RowToStructByPos[taskInfo])
	}
	if errors.Is(err, pgx.ErrNoRows) {
		http.Error(w, fmt.Sprintf("task %d does not exist", id), http.StatusNotFound)
		return
	}
	if err != nil {
		c.fail(w, "task", err)
		return
	}
	rows, err := c.pool.Query(ctx, readmodel.Query("steps"), id, d.Now)
	if err == nil {
		d.Steps, err = pgx.CollectRows(rows, pgx.RowToStructByPos[stepRow])
	}
	var edges [][2]int64
	if err == nil {
		rows, err = c.pool.Query(ctx, readmodel.Query("edges"), id)
		if err == nil {
			edges, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]int64, error) {
				var e [2]int64
				return e, row.Scan(&e[0], &e[1])
			})
		}
	}
	if err == nil {
		rows, err = c.pool.Query(ctx, readmodel.Query("events"), id, before, pageSize+1)
		if err == nil {
			d.Events, err = pgx.CollectRows(rows, pgx.RowToStructByPos[eventRow])
		}
	}
	var attempts []attemptRow
	if err == nil {
		rows, err = c.pool.Query(ctx, readmodel.Query("attempts"), id, nil)
		if err == nil {
			attempts, err = pgx.CollectRows(rows, pgx.RowToStructByPos[attemptRow])
		}
	}
	if err != nil {
		c.fail(w, "task", err)
		return
	}
	if len(d.Events) > pageSize {
		d.Events = d.Events[:pageSize]
		d.Next = fmt.Sprintf("/tasks/%d?before=%d", id, d.Events[pageSize-1].ID)
	}
	nodes := make([]dagNode, len(d.Steps))
	for i, s := range d.Steps {
		nodes[i] = dagNode{ID: s.ID, Name: s.Name, State: s.State, Attempts: s.Attempts, Max: s.MaxAttempts}
	}
	d.DAG = layoutDAG(nodes, edges)
	d.Timeline = drawTimeline(d.Steps, attempts, d.Now)
	c.render(w, r, "task", fmt.Sprintf("Task %d %s", d.Task.ID, d.Task.Name), "tasks", d)
}

// drawTimeline lays out one lane per step that has attempts and one bar per attempt, x proportional to time
// from the first attempt's start; the gaps between bars of a lane are the backoff waits.
func drawTimeline(steps []stepRow, attempts []attemptRow, now time.Time) timeline {
	const laneH, labelW, plotW = 22, 150, 700
	tl := timeline{Width: labelW + plotW + 20}
	if len(attempts) == 0 {
		return tl
	}
	start, end := attempts[0].Started, attempts[0].Started
	for _, a := range attempts {
		e := now
		if a.Ended != nil {
			e = *a.Ended
		}
		start = minTime(start, a.Started)
		end = maxTime(end, e)
	}
	span := end.Sub(start)
	if span <= 0 {
		span = time.Millisecond
	}
	tl.Span = span.Round(time.Millisecond).String()
	lane := map[int64]int{}
	for _, s := range steps {
		for _, a := range attempts {
			if a.StepID == s.ID {
				lane[s.ID] = len(tl.Lanes)
				tl.Lanes = append(tl.Lanes, timelineLane{Y: len(tl.Lanes)*laneH + 15, Name: s.Name})
				break
			}
		}
	}
	for _, a := range attempts {
		e := now
		if a.Ended != nil {
			e = *a.Ended
		}
		x := labelW + int(float64(plotW)*float64(a.Started.Sub(start))/float64(span))
		wd := max(int(float64(plotW)*float64(e.Sub(a.Started))/float64(span)), 3)
		tl.Bars = append(tl.Bars, timelineBar{X: x, Y: lane[a.StepID]*laneH + 4, W: wd,
			Label:   fmt.Sprintf("attempt %d: %s", a.Attempt, strings.TrimPrefix(a.Outcome, "attempt.")),
			Outcome: strings.ReplaceAll(a.Outcome, ".", "-")})
	}
	tl.Height = len(tl.Lanes)*laneH + 10
	return tl
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

type stepInfo struct {
	ID            int64
	TaskID        int64
	Name          string
	State         string
	Attempts      int32
	MaxAttempts   int32
	Handler       string
	Input         string
	Output        string
	LastError     string
	Iteration     int32
	NextAttemptAt *time.Time
}

type stepEvent struct {
	ID        int64
	Attempt   *int32
	Iteration *int32
	Event     string
	FromState string
	ToState   string
	Details   string
	At        time.Time
}

type reasonRow struct {
	Reason  string
	Message string
}

type stepData struct {
	Step     stepInfo
	Attempts []attemptRow
	Events   []stepEvent
	Reasons  []reasonRow
	Act      actionsView
}

func (c *Console) stepPage(w http.ResponseWriter, r *http.Request) {
	taskID, ok := pathID(w, r, "id")
	if !ok {
		return
	}
	stepID, ok := pathID(w, r, "step")
	if !ok {
		return
	}
	ctx := r.Context()
	var d stepData
	d.Act = c.actionsView(r)
	row, err := c.pool.Query(ctx, readmodel.Query("step"), taskID, stepID)
	if err == nil {
		d.Step, err = pgx.CollectExactlyOneRow(row, pgx.RowToStructByPos[stepInfo])
	}
	if errors.Is(err, pgx.ErrNoRows) {
		http.Error(w, fmt.Sprintf("task %d has no step %d", taskID, stepID), http.StatusNotFound)
		return
	}
	if err == nil {
		var rows pgx.Rows
		rows, err = c.pool.Query(ctx, readmodel.Query("attempts"), taskID, stepID)
		if err == nil {
			d.Attempts, err = pgx.CollectRows(rows, pgx.RowToStructByPos[attemptRow])
		}
		if err == nil {
			rows, err = c.pool.Query(ctx, readmodel.Query("step_events"), stepID)
			if err == nil {
				d.Events, err = pgx.CollectRows(rows, pgx.RowToStructByPos[stepEvent])
			}
		}
		if err == nil {
			rows, err = c.pool.Query(ctx, readmodel.Query("explain_step"), stepID, nil)
			if err == nil {
				d.Reasons, err = pgx.CollectRows(rows, pgx.RowToStructByPos[reasonRow])
			}
		}
	}
	if err != nil {
		c.fail(w, "step", err)
		return
	}
	c.render(w, r, "step", fmt.Sprintf("Step %s of task %d", d.Step.Name, taskID), "tasks", d)
}

type templateRow struct {
	Name       string
	Version    int32
	Definition string
	CreatedAt  time.Time
	YAML       string
}

func (c *Console) templatesPage(w http.ResponseWriter, r *http.Request) {
	rows, err := c.pool.Query(r.Context(), readmodel.Query("templates"))
	var list []templateRow
	if err == nil {
		list, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (templateRow, error) {
			var t templateRow
			return t, row.Scan(&t.Name, &t.Version, &t.Definition, &t.CreatedAt)
		})
	}
	if err != nil {
		c.fail(w, "templates", err)
		return
	}
	for i := range list {
		list[i].YAML = jsonToYAML(list[i].Definition)
	}
	c.render(w, r, "templates", "Templates", "templates", list)
}

// jsonToYAML renders a JSON document as YAML (the JSON itself if it cannot).
func jsonToYAML(doc string) string {
	var v any
	if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
		return doc
	}
	out, err := yaml.Marshal(v)
	if err != nil {
		return doc
	}
	return string(out)
}

type policyRow struct {
	Name        string
	MaxAttempts *int32
	Retryable   *bool
	Backoff     *string
	BaseDelayMs *int64
	Multiplier  *float64
	MaxDelayMs  *int64
	Jitter      *float64
	Timeline    policyTimeline
}

type simAttempt struct {
	Attempt  int32
	StartsMs int64
	Retry    bool
	DelayMs  *int64
}

type policyTimeline struct {
	Width   int
	Marks   []policyMark
	TotalMs int64
}

type policyMark struct {
	X      int
	Label  string
	Retry  bool
	GapX   int
	GapW   int
	HasGap bool
}

func (c *Console) policiesPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	rows, err := c.pool.Query(ctx, readmodel.Query("policies"))
	var list []policyRow
	if err == nil {
		list, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (policyRow, error) {
			var p policyRow
			return p, row.Scan(&p.Name, &p.MaxAttempts, &p.Retryable, &p.Backoff, &p.BaseDelayMs, &p.Multiplier,
				&p.MaxDelayMs, &p.Jitter)
		})
	}
	for i := range list {
		if err != nil {
			break
		}
		rows, err = c.pool.Query(ctx, readmodel.Query("policy_timeline"), list[i].Name)
		var sim []simAttempt
		if err == nil {
			sim, err = pgx.CollectRows(rows, pgx.RowToStructByPos[simAttempt])
		}
		list[i].Timeline = drawPolicy(sim)
	}
	if err != nil {
		c.fail(w, "policies", err)
		return
	}
	c.render(w, r, "policies", "Retry policies", "policies", list)
}

// drawPolicy places each simulated attempt on a line whose length is the total time to the last attempt.
func drawPolicy(sim []simAttempt) policyTimeline {
	const plotW, x0 = 640, 20
	pt := policyTimeline{Width: plotW + 2*x0 + 60}
	if len(sim) == 0 {
		return pt
	}
	pt.TotalMs = sim[len(sim)-1].StartsMs
	scale := func(ms int64) int {
		if pt.TotalMs == 0 {
			return x0
		}
		return x0 + int(float64(plotW)*float64(ms)/float64(pt.TotalMs))
	}
	for i, a := range sim {
		m := policyMark{X: scale(a.StartsMs), Label: fmt.Sprintf("#%d", a.Attempt), Retry: a.Retry}
		if a.Retry && a.DelayMs != nil && i+1 < len(sim) {
			m.HasGap, m.GapX, m.GapW = true, m.X, scale(sim[i+1].StartsMs)-m.X
			m.Label += " +" + (time.Duration(*a.DelayMs) * time.Millisecond).String()
		}
		pt.Marks = append(pt.Marks, m)
	}
	return pt
}

// genericTable is a table read from an optional relation (schedules, flow limits): its columns and rows as text.
type genericTable struct {
	Exists  bool
	Empty   string
	Columns []string
	Rows    [][]string
}

// optionalTable reads relation rel (which features added after the console may create) generically: absent,
// it says so with empty.
func (c *Console) optionalTable(r *http.Request, rel, empty string) (genericTable, error) {
	t := genericTable{Empty: empty}
	if err := c.pool.QueryRow(r.Context(), readmodel.Query("regclass"), rel).Scan(&t.Exists); err != nil || !t.Exists {
		return t, err
	}
	// rel is one of the console's constants, never user input.
	rows, err := c.pool.Query(r.Context(), "SELECT row_to_json(x)::text FROM "+rel+" x LIMIT 500")
	if err != nil {
		return t, err
	}
	docs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return t, err
	}
	for _, doc := range docs {
		dec := json.NewDecoder(strings.NewReader(doc))
		dec.UseNumber()
		var fields []string
		values := map[string]string{}
		if _, err := dec.Token(); err != nil {
			return t, fmt.Errorf("decode %s row: %w", rel, err)
		}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return t, fmt.Errorf("decode %s row: %w", rel, err)
			}
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return t, fmt.Errorf("decode %s row: %w", rel, err)
			}
			key := fmt.Sprint(k)
			fields = append(fields, key)
			var s string
			if json.Unmarshal(raw, &s) == nil {
				values[key] = s
			} else {
				values[key] = string(raw)
			}
		}
		if t.Columns == nil {
			t.Columns = fields
		}
		row := make([]string, len(t.Columns))
		for i, col := range t.Columns {
			row[i] = values[col]
		}
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}

func (c *Console) schedulesPage(w http.ResponseWriter, r *http.Request) {
	t, err := c.optionalTable(r, "stepready.schedules",
		"No schedules: schedules arrive with cron schedules (SPEC §15); none is defined in this database.")
	if err != nil {
		c.fail(w, "schedules", err)
		return
	}
	c.render(w, r, "table", "Schedules", "schedules", t)
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"rel": func(now time.Time, t *time.Time) string {
		if t == nil {
			return ""
		}
		d := t.Sub(now).Round(100 * time.Millisecond)
		if d >= 0 {
			return "in " + d.String()
		}
		return (-d).String() + " ago"
	},
	"ts": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
	"deref": func(p any) any {
		switch v := p.(type) {
		case *string:
			if v == nil {
				return ""
			}
			return *v
		case *int32:
			if v == nil {
				return ""
			}
			return *v
		case *int64:
			if v == nil {
				return ""
			}
			return *v
		case *float64:
			if v == nil {
				return ""
			}
			return *v
		case *bool:
			if v == nil {
				return ""
			}
			return *v
		}
		return p
	},
	"secs": func(p *float64) string {
		if p == nil {
			return "–"
		}
		return (time.Duration(*p * float64(time.Second))).Round(100 * time.Millisecond).String()
	},
	"add":  func(a, b int) int { return a + b },
	"half": func(a int) int { return a / 2 },
}
