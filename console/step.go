package console

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/stepready/stepready/internal/readmodel"
)

type stepData struct {
	*readmodel.StepDetail
	// Error is the last error as "class: message"; Finished is true for a terminal step.
	Error    string
	Finished bool
	Act      actionsView
}

// stepPage shows one step: why it is not running (every reason), its input, output, last error, attempts and
// events, read in one snapshot. The step is named by id or by name (/tasks/12/steps/charge_card).
func (c *Console) stepPage(w http.ResponseWriter, r *http.Request) {
	taskID, ok := c.pathID(w, r, "id")
	if !ok {
		return
	}
	ref := r.PathValue("step")
	stepID, ok := int64Param(ref)
	if !ok || stepID == nil {
		id, err := readmodel.StepID(r.Context(), c.pool, taskID, ref)
		if errors.Is(err, readmodel.ErrNotFound) {
			c.errorPage(w, r, http.StatusNotFound, fmt.Sprintf("Task %d has no step %q.", taskID, ref))
			return
		}
		if err != nil {
			c.fail(w, "step", err)
			return
		}
		stepID = &id
	}
	detail, err := readmodel.ReadStep(r.Context(), c.pool, taskID, *stepID, nil)
	if errors.Is(err, readmodel.ErrNotFound) {
		c.errorPage(w, r, http.StatusNotFound, fmt.Sprintf("Task %d has no step %d.", taskID, *stepID))
		return
	}
	if err != nil {
		c.fail(w, "step", err)
		return
	}
	d := stepData{StepDetail: detail, Error: detail.LastErrorText(),
		Finished: slices.Contains(terminalStates, detail.State), Act: c.actionsView(r)}
	c.render(w, r, "step", fmt.Sprintf("Step %s of task %d", detail.Name, taskID), "tasks", d)
}
