package console

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"time"

	"github.com/stepready/stepready/internal/readmodel"
)

// page is what every page's layout needs.
type page struct {
	Title   string
	Nav     string
	Queues  []readmodel.QueueStat
	Actions actionsView
	Flash   *flash
	Path    string
	Data    any
}

// render writes page name with the header's backlog.
func (c *Console) render(w http.ResponseWriter, r *http.Request, name, title, nav string, data any) {
	p := page{Title: title, Nav: nav, Data: data, Actions: c.actionsView(r), Flash: takeFlash(w, r),
		Path: r.URL.Path}
	var err error
	if p.Queues, err = readmodel.Backlog(r.Context(), c.pool); err != nil {
		c.fail(w, "backlog", err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := c.tmpl[name].Execute(w, p); err != nil {
		c.log.Error("console: render", "page", name, "err", err)
	}
}

// fail answers 500 without the error's text (which may name internals) and logs it.
func (c *Console) fail(w http.ResponseWriter, what string, err error) {
	c.log.Error("console: query failed", "what", what, "err", err)
	http.Error(w, "internal error reading "+what, http.StatusInternalServerError)
}

// errorData is what the error page shows: the message and a way back.
type errorData struct {
	Message   string
	Back      string
	BackLabel string
}

// errorPage answers status with a page of the console saying msg, with a link back (to the task when the path
// names one, else to the task list), instead of a bare text page.
func (c *Console) errorPage(w http.ResponseWriter, r *http.Request, status int, msg string) {
	d := errorData{Message: msg, Back: "/", BackLabel: "Tasks"}
	if id, ok := int64Param(r.PathValue("id")); ok && id != nil && r.PathValue("step") != "" {
		d.Back, d.BackLabel = fmt.Sprintf("/tasks/%d", *id), fmt.Sprintf("Task %d", *id)
	}
	w.WriteHeader(status)
	c.render(w, r, "error", http.StatusText(status), "", d)
}

// notFoundPage answers the paths the console does not serve.
func (c *Console) notFoundPage(w http.ResponseWriter, r *http.Request) {
	c.errorPage(w, r, http.StatusNotFound, "No page at "+r.URL.Path+".")
}

// int64Param parses an optional positive int64 query or path value; ok is false on a malformed one.
func int64Param(s string) (v *int64, ok bool) {
	if s == "" {
		return nil, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return nil, false
	}
	return &n, true
}

// pathID reads path value name as a positive id, answering 404 when it is not one.
func (c *Console) pathID(w http.ResponseWriter, r *http.Request, name string) (int64, bool) {
	id, ok := int64Param(r.PathValue(name))
	if !ok || id == nil {
		c.errorPage(w, r, http.StatusNotFound, fmt.Sprintf("%q is not a %s id.", r.PathValue(name), name))
		return 0, false
	}
	return *id, true
}

// deref returns what p points to, or 0 when it is nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// errorText is "class: message" of an error document, as every face prints it (readmodel.ErrorText).
func errorText(doc json.RawMessage) string { return readmodel.ErrorText(doc) }

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	// cutjson is a JSON document cut at outputCut characters.
	"cutjson": func(doc json.RawMessage) string { return cut(doc, outputCut) },
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
	"ts": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			return v.UTC().Format("2006-01-02 15:04:05.000Z")
		case *time.Time:
			if v == nil {
				return ""
			}
			return v.UTC().Format("2006-01-02 15:04:05.000Z")
		}
		return ""
	},
	"deref": func(p any) any {
		switch v := p.(type) {
		case *string:
			return deref(v)
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
	"json":    func(doc json.RawMessage) string { return string(doc) },
	"errtext": errorText,
	"secs": func(p float64) string {
		if p <= 0 {
			return "–"
		}
		return (time.Duration(p * float64(time.Second))).Round(100 * time.Millisecond).String()
	},
	"add":  func(a, b int) int { return a + b },
	"half": func(a int) int { return a / 2 },
}
