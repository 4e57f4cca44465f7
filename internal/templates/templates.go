// Package templates reads task templates written in YAML (the task definition of SPEC §10) and stores them in
// stepready.task_templates.
//
// YAML is only a notation here: a file is decoded strictly (one document, a mapping at the top, no duplicate
// keys, no unknown key), converted to JSON, and handed to the database, whose task_templates trigger validates
// the definition with the same rules and messages as create_task. Go checks only what it can say better than
// SQL: an unknown key is reported with its line and column (the database would name it without a line), and
// the CEL of outcome rules is compiled (rules.Validate: Postgres cannot); values are left to the database.
package templates

import (
	"bytes"
	"cmp"
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
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/rules"
	"github.com/stepready/stepready/schedules"
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
	// Version is the template's version (the file's top-level version key, default 1); name and version
	// identify a stored template, and tasks are created from the newest version.
	Version int
	// File is the file it was read from, for messages.
	File string
	// Definition is the task definition as JSON.
	Definition json.RawMessage
	// Schedules are the cron schedules the file declares (its top-level `schedules:` list, not part of the
	// definition); a schedule without a template uses this one. Apply creates or replaces them.
	Schedules []schedules.Definition
}

// Parse decodes one YAML template. file names it in errors. The document must be a mapping with a non-empty
// string name, an optional integer version >= 1 (not part of the definition) and only the keys of a task
// definition (SPEC §10); everything else is checked by the database when the template is stored.
func Parse(file string, data []byte) (Template, error) {
	def, err := decode(file, data, true)
	if err != nil {
		return Template{}, err
	}
	version := 1
	if v, ok := def["version"]; ok {
		n, ok := v.(uint64)
		if !ok || n < 1 || n > 1<<31-1 {
			return Template{}, fmt.Errorf("%s: version: must be an integer >= 1, got %v", file, v)
		}
		version = int(n)
		delete(def, "version")
	}
	name, ok := def["name"].(string)
	if !ok || name == "" {
		return Template{}, fmt.Errorf("%s: name: a non-empty string is required", file)
	}
	var scheds []schedules.Definition
	if v, ok := def["schedules"]; ok {
		if scheds, err = parseSchedules(file, name, v); err != nil {
			return Template{}, err
		}
		delete(def, "schedules")
	}
	b, err := json.Marshal(def)
	if err != nil {
		return Template{}, fmt.Errorf("%s: not representable as JSON: %w", file, err)
	}
	// Postgres cannot compile CEL: the outcome rules are compiled here, before anything is stored (SPEC §8).
	if err := rules.Validate(b); err != nil {
		return Template{}, fmt.Errorf("%s: %w", file, err)
	}
	return Template{Name: name, Version: version, File: file, Definition: b, Schedules: scheds}, nil
}

// parseSchedules reads a template's `schedules:` list: each entry has the fields of `scheduler schedule create`
// (name, template, cron, timezone, context, overlap); template defaults to the file's template. Cron and time
// zone are checked here, with the entry's index and name.
func parseSchedules(file, template string, v any) ([]schedules.Definition, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%s: schedules: must be a list of schedules, got %s", file, describe(v))
	}
	out := make([]schedules.Definition, 0, len(list))
	seen := map[string]bool{}
	for i, e := range list {
		b, err := json.Marshal(e)
		if err != nil {
			return nil, fmt.Errorf("%s: schedules[%d]: not representable as JSON: %w", file, i, err)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var d schedules.Definition
		if err := dec.Decode(&d); err != nil {
			return nil, fmt.Errorf("%s: schedules[%d]: %w", file, i, err)
		}
		if d.Template == "" {
			d.Template = template
		}
		if _, err := d.Validate(); err != nil {
			return nil, fmt.Errorf("%s: schedules[%d]: %w", file, i, err)
		}
		if seen[d.Name] {
			return nil, fmt.Errorf("%s: schedules[%d]: name %q: declared twice", file, i, d.Name)
		}
		seen[d.Name] = true
		out = append(out, d)
	}
	return out, nil
}

// ParseDefinition decodes one YAML task definition (the document `scheduler task create -f` reads) into the
// JSON that stepready.create_task takes, with the strict checks of Parse; a definition has no version.
func ParseDefinition(file string, data []byte) (json.RawMessage, error) {
	def, err := decode(file, data, false)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(def)
	if err != nil {
		return nil, fmt.Errorf("%s: not representable as JSON: %w", file, err)
	}
	if err := rules.Validate(b); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return b, nil
}

// decode reads one YAML document that must be a task definition mapping (plus version when withVersion).
func decode(file string, data []byte, withVersion bool) (map[string]any, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data), yaml.Strict())
	var doc any
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: empty document", file)
		}
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: one template per file: found a second YAML document", file)
	}
	def, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: a template is a mapping (name, steps, …), got %s", file, describe(doc))
	}
	// Aliases are decoded as shared values: a small file can expand to an enormous definition (the "billion
	// laughs"). Count before anything else walks it.
	if !withinNodes(def, maxNodes) {
		return nil, fmt.Errorf("%s: too large: more than %d values once aliases are expanded", file, maxNodes)
	}
	// The same document again, into the shape of a definition, only to report an unknown key with its line.
	var shape any = &definitionKeys{}
	if withVersion {
		shape = &templateKeys{}
	}
	if err := yaml.NewDecoder(bytes.NewReader(data), yaml.Strict()).Decode(shape); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return def, nil
}

// definitionKeys is the set of keys of a task definition (SPEC §10; the lists of validate_task_definition in
// sql/100_definitions.sql). Values are `any`: checking them is the database's job.
type definitionKeys struct {
	Name           any        `yaml:"name"`
	Namespace      any        `yaml:"namespace"`
	Context        any        `yaml:"context"`
	Priority       any        `yaml:"priority"`
	IdempotencyKey any        `yaml:"idempotency_key"`
	RunAt          any        `yaml:"run_at"`
	Retry          *retryKeys `yaml:"retry"`
	Concurrency    *flowKeys  `yaml:"concurrency"`
	RateLimit      *flowKeys  `yaml:"rate_limit"`
	Steps          []stepKeys `yaml:"steps"`
}

// templateKeys is definitionKeys plus the template's version.
type templateKeys struct {
	Version        any        `yaml:"version"`
	Schedules      any        `yaml:"schedules"`
	Name           any        `yaml:"name"`
	Namespace      any        `yaml:"namespace"`
	Context        any        `yaml:"context"`
	Priority       any        `yaml:"priority"`
	IdempotencyKey any        `yaml:"idempotency_key"`
	RunAt          any        `yaml:"run_at"`
	Retry          *retryKeys `yaml:"retry"`
	Concurrency    *flowKeys  `yaml:"concurrency"`
	RateLimit      *flowKeys  `yaml:"rate_limit"`
	Steps          []stepKeys `yaml:"steps"`
}

type retryKeys struct {
	Policy      any `yaml:"policy"`
	MaxAttempts any `yaml:"max_attempts"`
	Retryable   any `yaml:"retryable"`
	Backoff     any `yaml:"backoff"`
	BaseDelayMs any `yaml:"base_delay_ms"`
	Multiplier  any `yaml:"multiplier"`
	MaxDelayMs  any `yaml:"max_delay_ms"`
	Jitter      any `yaml:"jitter"`
}

type stepKeys struct {
	Name          any        `yaml:"name"`
	Handler       any        `yaml:"handler"`
	Input         any        `yaml:"input"`
	DependsOn     any        `yaml:"depends_on"`
	Retry         *retryKeys `yaml:"retry"`
	TimeoutMs     any        `yaml:"timeout_ms"`
	OnExhausted   any        `yaml:"on_exhausted"`
	Rules         any        `yaml:"rules"`
	MaxIterations any        `yaml:"max_iterations"`
	Collect       any        `yaml:"collect"`
	Queue         any        `yaml:"queue"`
	Priority      any        `yaml:"priority"`
	BreakerLimit  any        `yaml:"breaker_limit"`
	Concurrency   *flowKeys  `yaml:"concurrency"`
	RateLimit     *flowKeys  `yaml:"rate_limit"`
	Map           *mapKeys   `yaml:"map"`
	Wait          *waitKeys  `yaml:"wait"`
}

// waitKeys is a wait step's wait (SPEC §20): a signal with its timeout, or a sleep; the database checks which
// go together.
type waitKeys struct {
	Signal     any `yaml:"signal"`
	TimeoutMs  any `yaml:"timeout_ms"`
	OnTimeout  any `yaml:"on_timeout"`
	DurationMs any `yaml:"duration_ms"`
	Until      any `yaml:"until"`
}

// mapKeys is a map step's fan-out (SPEC §19): what it maps over and its limits, which the database checks.
type mapKeys struct {
	Over        any `yaml:"over"`
	MaxInFlight any `yaml:"max_in_flight"`
	MaxElements any `yaml:"max_elements"`
}

// flowKeys is a concurrency or rate limit (SPEC §14): period_ms belongs to rate limits only, which the database
// checks.
type flowKeys struct {
	Key      any `yaml:"key"`
	Limit    any `yaml:"limit"`
	PeriodMs any `yaml:"period_ms"`
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

// Store writes the templates to stepready.task_templates (insert, or replace the definition of the same name and
// version), all in one transaction: an invalid template stores none. The error names the file and the
// database's message.
func Store(ctx context.Context, pool *pgxpool.Pool, ts []Template) error {
	_, err := Apply(ctx, pool, ts)
	return err
}

// Applied says what Apply did with one template.
type Applied struct {
	Template
	// Created is true when the name and version were new, false when an existing definition was replaced.
	Created bool
	// SchedulesCreated says, for each of Template.Schedules in order, whether it was new (false: replaced).
	SchedulesCreated []bool
}

// Apply is Store, reporting for each template whether it was created or replaced.
func Apply(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, ts []Template,
) ([]Applied, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	out := make([]Applied, 0, len(ts))
	for _, t := range ts {
		a := Applied{Template: t}
		a.Version = cmp.Or(a.Version, 1)
		if err := tx.QueryRow(ctx, upsertTemplateSQL, t.Name, t.Definition, a.Version).Scan(&a.Created); err != nil {
			return nil, fmt.Errorf("templates: %s: store template %q: %w", t.File, t.Name, err)
		}
		for _, d := range t.Schedules {
			created, err := schedules.Put(ctx, tx, d, true)
			if err != nil {
				return nil, fmt.Errorf("templates: %s: store schedule %q: %w", t.File, d.Name, err)
			}
			a.SchedulesCreated = append(a.SchedulesCreated, created)
		}
		out = append(out, a)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	return out, nil
}

// CreateTask creates one task from the newest version of template name and returns its id.
func CreateTask(ctx context.Context, pool *pgxpool.Pool, name string) (int64, error) {
	var id int64
	if err := pool.QueryRow(ctx, createTaskSQL, name).Scan(&id); err != nil {
		return 0, fmt.Errorf("templates: create a task from %q: %w", name, err)
	}
	return id, nil
}

// ParseDefinitions reads many task definitions from one file, for bulk creation: a YAML stream (documents
// separated by ---, each one definition) or a single JSON or YAML sequence of definitions. Each definition is
// checked as ParseDefinition checks one (known keys, size, outcome rules compiled), and an error names the
// file and the definition's 0-based index: `tasks.yaml: definitions[2]: …`. A file holding one definition
// mapping gives a slice of one; stream reports whether the file was a stream of several documents or a
// sequence, so that a caller can tell a batch of one from a single definition.
func ParseDefinitions(file string, data []byte) (defs []json.RawMessage, stream bool, err error) {
	dec := yaml.NewDecoder(bytes.NewReader(data), yaml.Strict())
	var docs []any
	for {
		var doc any
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			if len(docs) == 0 {
				// The first document: reported exactly as a single definition's error.
				if _, perr := ParseDefinition(file, data); perr != nil {
					return nil, false, perr
				}
				return nil, false, fmt.Errorf("%s: %w", file, err)
			}
			return nil, false, fmt.Errorf("%s: document %d: %w", file, len(docs)+1, err)
		}
		docs = append(docs, doc)
	}
	switch {
	case len(docs) == 0:
		return nil, false, fmt.Errorf("%s: empty document", file)
	case len(docs) == 1:
		if seq, ok := docs[0].([]any); ok {
			docs, stream = seq, true
		} else {
			def, err := ParseDefinition(file, data)
			if err != nil {
				return nil, false, err
			}
			return []json.RawMessage{def}, false, nil
		}
	default:
		stream = true
	}
	if len(docs) == 0 {
		return nil, true, fmt.Errorf("%s: an empty sequence: no task definitions", file)
	}
	defs = make([]json.RawMessage, 0, len(docs))
	for i, doc := range docs {
		where := fmt.Sprintf("%s: definitions[%d]", file, i)
		if !withinNodes(doc, maxNodes) {
			return nil, true, fmt.Errorf("%s: too large: more than %d values once aliases are expanded", where, maxNodes)
		}
		// Each definition again on its own, as YAML, through the checks of a single one.
		one, err := yaml.Marshal(doc)
		if err != nil {
			return nil, true, fmt.Errorf("%s: %w", where, err)
		}
		def, err := ParseDefinition(where, one)
		if err != nil {
			return nil, true, err
		}
		defs = append(defs, def)
	}
	return defs, true, nil
}
