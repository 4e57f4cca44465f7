package console

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

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
	// Waits says what a wait step waits for (SPEC §20); nil for a step run by a handler.
	Waits *waitView
}

// waitView is what a wait step's page says it waits for.
type waitView struct {
	// Signal is the name of the signal it waits for ("" for a sleep).
	Signal string
	// Timeout is its timeout as defined ("" for none) and OnTimeout what happens then (fail or continue).
	Timeout, OnTimeout string
	// Sleep is a sleep as defined: "1m30s" of a duration_ms, or the until of an until (a time or a reference).
	Sleep string
	// Until is, while it waits, when its sleep ends or its signal wait times out.
	Until *time.Time
	// Waiting says it waits now (its parents are done); SendForm says the signal form is drawn.
	Waiting, SendForm bool
}

// newWaitView reads a step's wait (nil when it has none).
func newWaitView(d *readmodel.StepDetail, finished bool, act actionsView) *waitView {
	if len(d.Wait) == 0 || string(d.Wait) == "null" {
		return nil
	}
	var w struct {
		Signal     string          `json:"signal"`
		TimeoutMS  *int64          `json:"timeout_ms"`
		OnTimeout  string          `json:"on_timeout"`
		DurationMS *int64          `json:"duration_ms"`
		Until      json.RawMessage `json:"until"`
	}
	if json.Unmarshal(d.Wait, &w) != nil {
		return nil
	}
	v := &waitView{Signal: w.Signal, Until: d.WaitUntil, Waiting: d.State == "waiting"}
	if w.TimeoutMS != nil {
		v.Timeout = (time.Duration(*w.TimeoutMS) * time.Millisecond).String()
		v.OnTimeout = cmp.Or(w.OnTimeout, "fail")
	}
	switch {
	case w.DurationMS != nil:
		v.Sleep = "for " + (time.Duration(*w.DurationMS) * time.Millisecond).String()
	case len(w.Until) > 0:
		var until string
		if json.Unmarshal(w.Until, &until) != nil {
			until = string(w.Until)
		}
		v.Sleep = "until " + until
	}
	v.SendForm = v.Signal != "" && !finished && act.SignedIn
	return v
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
	d.Waits = newWaitView(detail, d.Finished, d.Act)
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
