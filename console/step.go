package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/stepready/stepready/internal/readmodel"
)

type stepData struct {
	*readmodel.StepDetail
	// Error is the last error as "class: message"; Finished is true for a terminal step.
	Error    string
	Finished bool
	Act      actionsView
	// Elements are a page of a map step's elements (ElementsNext: the next page's link, if any).
	Elements     []elementView
	ElementsNext string
}

// elementView is an element of a map step as the step page lists it.
type elementView struct {
	readmodel.Element
	// Error is the last error as "class: message"; Out is the output's JSON cut at outputCut characters.
	Error string
	Out   string
}

// outputCut is how many characters of an element's output the element list shows (its own page shows it whole).
const outputCut = 80

// cut is doc's JSON cut at n characters ("" for none).
func cut(doc json.RawMessage, n int) string {
	if len(doc) == 0 || string(doc) == "null" {
		return ""
	}
	r := []rune(string(doc))
	if len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return string(r)
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
	// ?after=INDEX: the page of a map step's elements after that index.
	after := int32(-1)
	if v := r.URL.Query().Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			c.errorPage(w, r, http.StatusBadRequest, "after: want an element index (0 or more).")
			return
		}
		after = int32(n)
	}
	detail, err := readmodel.ReadStepPage(r.Context(), c.pool, taskID, *stepID, readmodel.StepOptions{
		ElementsAfter: after, ElementsLimit: pageSize})
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
	for _, e := range detail.Elements {
		d.Elements = append(d.Elements, elementView{Element: e, Error: readmodel.ErrorText(e.LastError),
			Out: cut(e.Output, outputCut)})
	}
	if detail.MoreElements {
		d.ElementsNext = fmt.Sprintf("/tasks/%d/steps/%d?after=%d", taskID, detail.ID,
			detail.Elements[len(detail.Elements)-1].Index)
	}
	c.render(w, r, "step", fmt.Sprintf("Step %s of task %d", detail.Name, taskID), "tasks", d)
}
