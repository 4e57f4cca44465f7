package readmodel

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Template is one version of a task template.
type Template struct {
	Name    string `json:"name"`
	Version int32  `json:"version"`
	// Newest is true for the template's highest version (what create_task_from_template uses).
	Newest bool `json:"newest"`
	// Steps is the number of steps of the definition.
	Steps      int32           `json:"steps"`
	Definition json.RawMessage `json:"definition"`
	CreatedAt  time.Time       `json:"created_at"`
}

// Templates returns every version of every template, by name and version.
func Templates(ctx context.Context, q Querier) ([]Template, error) {
	return collect(ctx, q, "templates", func(row pgx.Row, t *Template) error {
		return row.Scan(&t.Name, &t.Version, &t.Newest, &t.Steps, &t.Definition, &t.CreatedAt)
	})
}

// TemplateExists reports whether any version of template name is stored.
func TemplateExists(ctx context.Context, q Querier, name string) (bool, error) {
	var ok bool
	if err := q.QueryRow(ctx, query("template_exists"), name).Scan(&ok); err != nil {
		return false, fmt.Errorf("readmodel: template exists: %w", err)
	}
	return ok, nil
}
