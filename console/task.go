package console

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/stepready/stepready/internal/readmodel"
)

// terminalStates are the step states no attempt follows (SPEC §5): readiness no longer applies to them.
var terminalStates = []string{"complete", "error", "skipped", "cancelled", "resolved_manually"}

// stepView is a step as the task page shows it.
type stepView struct {
	readmodel.Step
	// WhyNot is why it is not running: explain's reason, or nothing for a ready or finished step.
	WhyNot string
	// Error is the last error as "class: message".
	Error string
}

type taskData struct {
	*readmodel.TaskDetail
	Steps    []stepView
	DAG      dagLayout
	Next     string
	Timeline timeline
	Act      actionsView
}

// taskPage shows a task: its DAG, its steps with the reason each is not running, its attempt timeline and a page
// of its events, all read in one snapshot.
func (c *Console) taskPage(w http.ResponseWriter, r *http.Request) {
	id, ok := c.pathID(w, r, "id")
	if !ok {
		return
	}
	before, ok := int64Param(r.URL.Query().Get("before"))
	if !ok {
		c.errorPage(w, r, http.StatusBadRequest, "before: want a positive event id.")
		return
	}
	detail, err := readmodel.ReadTask(r.Context(), c.pool, id, readmodel.TaskOptions{Attempts: true, Events: true,
		EventsBefore: deref(before), EventsLimit: pageSize})
	if errors.Is(err, readmodel.ErrNotFound) {
		c.errorPage(w, r, http.StatusNotFound, fmt.Sprintf("Task %d does not exist.", id))
		return
	}
	if err != nil {
		c.fail(w, "task", err)
		return
	}
	d := taskData{TaskDetail: detail, Act: c.actionsView(r)}
	if detail.MoreEvents {
		d.Next = fmt.Sprintf("/tasks/%d?before=%d", id, detail.Events[len(detail.Events)-1].ID)
	}
	nodes := make([]dagNode, 0, len(detail.StepList))
	for _, s := range detail.StepList {
		if s.IsElement() {
			continue // its map step stands for it: one node with a progress bar, the elements on its step page
		}
		nodes = append(nodes, mapNode(s))
		v := stepView{Step: s, Error: s.LastErrorText()}
		if !s.Ready && !slices.Contains(terminalStates, s.State) {
			v.WhyNot = s.Why
		}
		d.Steps = append(d.Steps, v)
	}
	edges := make([][2]int64, len(detail.Edges))
	for i, e := range detail.Edges {
		edges[i] = [2]int64{e.Parent, e.Child}
	}
	d.DAG = layoutDAG(nodes, edges)
	d.Timeline = drawTimeline(detail.StepList, detail.Attempts, detail.AsOf)
	c.render(w, r, "task", fmt.Sprintf("Task %d %s", detail.ID, detail.Name), "tasks", d)
}
