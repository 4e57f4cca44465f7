// Package templates reads task templates written in YAML (the task definition of SPEC §10) and stores them in
// stepready.task_templates.
//
// YAML is only a notation here: a file is decoded strictly (one document, a mapping at the top, no duplicate
// keys), converted to JSON, and handed to the database, whose task_templates trigger validates the definition
// with the same rules and messages as create_task. Nothing in Go re-checks what SQL checks.
package templates

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"

	"github.com/goccy/go-yaml"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	//go:embed sql/upsert_template.sql
	upsertTemplateSQL string
	//go:embed sql/create_task_from_template.sql
	createTaskSQL string
)

// Template is one task template read from a file.
type Template struct {
	// Name is the template's name: the definition's name field.
	Name string
	// File is the file it was read from, for messages.
	File string
	// Definition is the task definition as JSON.
	Definition json.RawMessage
}

// Parse decodes one YAML template. file names it in errors. The document must be a mapping with a non-empty
// string name; everything else is checked by the database when the template is stored.
func Parse(file string, data []byte) (Template, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data), yaml.Strict())
	var doc any
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return Template{}, fmt.Errorf("%s: empty document", file)
		}
		return Template{}, fmt.Errorf("%s: %w", file, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Template{}, fmt.Errorf("%s: one template per file: found a second YAML document", file)
	}
	def, ok := doc.(map[string]any)
	if !ok {
		return Template{}, fmt.Errorf("%s: a template is a mapping (name, steps, …), got %s", file, describe(doc))
	}
	name, ok := def["name"].(string)
	if !ok || name == "" {
		return Template{}, fmt.Errorf("%s: name: a non-empty string is required", file)
	}
	// Aliases are decoded as shared values: a small file can expand to an enormous definition (the "billion
	// laughs"). Count before encoding.
	if !withinNodes(def, maxNodes) {
		return Template{}, fmt.Errorf("%s: too large: more than %d values once aliases are expanded", file, maxNodes)
	}
	b, err := json.Marshal(def)
	if err != nil {
		return Template{}, fmt.Errorf("%s: not representable as JSON: %w", file, err)
	}
	return Template{Name: name, File: file, Definition: b}, nil
}

// maxNodes bounds the number of values (scalars, mappings, sequences) of one template, aliases expanded.
const maxNodes = 100_000

// withinNodes reports whether v holds at most limit values, counting each use of a shared value.
func withinNodes(v any, limit int) bool {
	budget := limit
	var walk func(v any) bool
	walk = func(v any) bool {
		budget--
		if budget < 0 {
			return false
		}
		switch v := v.(type) {
		case map[string]any:
			for _, e := range v {
				if !walk(e) {
					return false
				}
			}
		case []any:
			for _, e := range v {
				if !walk(e) {
					return false
				}
			}
		}
		return true
	}
	return walk(v)
}

// describe names the YAML kind of a decoded value.
func describe(v any) string {
	switch v.(type) {
	case nil:
		return "nothing"
	case []any:
		return "a sequence"
	default:
		return fmt.Sprintf("a scalar (%v)", v)
	}
}

// Load parses every *.yaml and *.yml file at the top of fsys, in file-name order. Two files may not define the
// same template name.
func Load(fsys fs.FS) ([]Template, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	var out []Template
	for _, e := range entries {
		if e.IsDir() || (path.Ext(e.Name()) != ".yaml" && path.Ext(e.Name()) != ".yml") {
			continue
		}
		data, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("templates: %w", err)
		}
		t, err := Parse(e.Name(), data)
		if err != nil {
			return nil, fmt.Errorf("templates: %w", err)
		}
		if i := slices.IndexFunc(out, func(o Template) bool { return o.Name == t.Name }); i >= 0 {
			return nil, fmt.Errorf("templates: %s and %s both define the template %q", out[i].File, t.File, t.Name)
		}
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, errors.New("templates: no *.yaml or *.yml file found")
	}
	return out, nil
}

// Store writes the templates to stepready.task_templates as version 1 (insert, or replace the definition), all
// in one transaction: an invalid template stores none. The error names the file and the database's message.
func Store(ctx context.Context, pool *pgxpool.Pool, ts []Template) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, t := range ts {
		if _, err := tx.Exec(ctx, upsertTemplateSQL, t.Name, t.Definition); err != nil {
			return fmt.Errorf("templates: %s: store template %q: %w", t.File, t.Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	return nil
}

// CreateTask creates one task from the newest version of template name and returns its id.
func CreateTask(ctx context.Context, pool *pgxpool.Pool, name string) (int64, error) {
	var id int64
	if err := pool.QueryRow(ctx, createTaskSQL, name).Scan(&id); err != nil {
		return 0, fmt.Errorf("templates: create a task from %q: %w", name, err)
	}
	return id, nil
}
