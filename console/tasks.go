package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/stepready/stepready/internal/readmodel"
)

type tasksData struct {
	Statuses  []string
	Status    string
	Name      string
	Namespace string
	ID        string
	Tasks     []readmodel.TaskSummary
	Counts    readmodel.StatusCounts
	Next      string
	Message   string
}

// tasksPage lists tasks, newest first, with the filters and the counts per status.
func (c *Console) tasksPage(w http.ResponseWriter, r *http.Request) {
	qv := r.URL.Query()
	d := tasksData{Statuses: readmodel.TaskFilterStatuses, Status: qv.Get("status"), Name: qv.Get("name"),
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
		c.errorPage(w, r, http.StatusBadRequest, "after: want a positive task id.")
		return
	}
	ctx := r.Context()
	var err error
	d.Tasks, err = readmodel.ListTasks(ctx, c.pool, readmodel.TaskFilter{Status: d.Status, Name: d.Name,
		Namespace: d.Namespace, Before: deref(after), Limit: pageSize + 1})
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
	if d.Counts, err = readmodel.CountTasks(ctx, c.pool, estimateThreshold); err != nil {
		c.fail(w, "counts", err)
		return
	}
	c.render(w, r, "tasks", "Tasks", "tasks", d)
}
