package console

import (
	"net/http"

	"github.com/goccy/go-yaml"

	"github.com/stepready/stepready/internal/readmodel"
)

// templateView is a template version with its definition as YAML.
type templateView struct {
	readmodel.Template
	YAML string
}

// templatesPage lists every version of every template, with its definition as YAML.
func (c *Console) templatesPage(w http.ResponseWriter, r *http.Request) {
	list, err := readmodel.Templates(r.Context(), c.pool)
	if err != nil {
		c.fail(w, "templates", err)
		return
	}
	views := make([]templateView, len(list))
	for i, t := range list {
		views[i] = templateView{Template: t, YAML: jsonToYAML(string(t.Definition))}
	}
	c.render(w, r, "templates", "Templates", "templates", views)
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
