// Package readmodel holds what operators read, once: every query behind the web console's pages, the CLI's
// `task list`, `task show`, `task events` and `explain`, kept in queries.sql (STYLE: one read model, many faces).
// The faces only render: the scheduling rules stay in SQL (explain_task, step_readiness, queue_stats,
// flow_status), never re-derived here or in them.
package readmodel

import (
	_ "embed"
	"fmt"
	"strings"
)

//go:embed queries.sql
var queriesSQL string

// queries maps a query name ("-- name: x" in queries.sql) to its text.
var queries = mustParseQueries(queriesSQL)

// mustParseQueries splits a file of "-- name: x" sections; it panics on a duplicate or empty name (a build-time
// mistake caught by every test).
func mustParseQueries(text string) map[string]string {
	out := map[string]string{}
	var name string
	var body strings.Builder
	flush := func() {
		if name != "" {
			out[name] = strings.TrimSpace(body.String())
		}
		body.Reset()
	}
	for line := range strings.SplitSeq(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "-- name:"); ok {
			flush()
			name = strings.TrimSpace(rest)
			if name == "" {
				panic("readmodel: queries.sql: empty query name")
			}
			if _, dup := out[name]; dup {
				panic(fmt.Sprintf("readmodel: queries.sql: query %q twice", name))
			}
			continue
		}
		body.WriteString(line)
		body.WriteByte('\n')
	}
	flush()
	return out
}

// Query returns the query named name; it panics on an unknown name (a programming mistake every test of its
// caller catches).
func Query(name string) string {
	s, ok := queries[name]
	if !ok {
		panic(fmt.Sprintf("readmodel: no query %q in queries.sql", name))
	}
	return s
}
