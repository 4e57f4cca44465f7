package docs

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// The SQL examples of the pages (```sql blocks) name functions, parameters, tables and columns that must exist:
// TestDocsSQLPlans has PostgreSQL plan every query and data-changing statement of them (EXPLAIN, which runs
// nothing), so an example that calls a function with the wrong arguments or reads a column that is gone fails.
// Statements that cannot be planned (CREATE ROLE, GRANT, BEGIN…) are only parsed by the page's reader. Examples
// written for psql keep working: its meta-commands (\gset, \echo, \if…) are dropped and its variables (:step_id,
// :'name') planned as a literal.

// splitSQL splits a SQL text into statements at the semicolons outside quotes, dollar quotes and comments.
func splitSQL(text string) []string {
	var out []string
	start := 0
	for i := 0; i < len(text); i++ {
		switch {
		case strings.HasPrefix(text[i:], "--"):
			if j := strings.IndexByte(text[i:], '\n'); j >= 0 {
				i += j
			} else {
				i = len(text)
			}
		case strings.HasPrefix(text[i:], "/*"):
			if j := strings.Index(text[i+2:], "*/"); j >= 0 {
				i += j + 3
			} else {
				i = len(text)
			}
		case text[i] == '\'' || text[i] == '"':
			q := text[i]
			for i++; i < len(text) && text[i] != q; i++ {
			}
		case text[i] == '$':
			if m := dollarTag.FindString(text[i:]); m != "" {
				if j := strings.Index(text[i+len(m):], m); j >= 0 {
					i += len(m) + j + len(m) - 1
				} else {
					i = len(text)
				}
			}
		case text[i] == ';':
			out = append(out, text[start:i])
			start = i + 1
		}
	}
	out = append(out, text[start:])
	var statements []string
	for _, s := range out {
		if strings.TrimSpace(stripComments(s)) != "" {
			statements = append(statements, strings.TrimSpace(s))
		}
	}
	return statements
}

// dollarTag matches the opening of a dollar-quoted string: $$ or $tag$.
var dollarTag = regexp.MustCompile(`^\$[A-Za-z_]*\$`)

// lineComment matches a -- comment to the end of its line.
var lineComment = regexp.MustCompile(`(?m)--.*$`)

// stripComments removes the -- comments of a statement (enough to see how it starts).
func stripComments(s string) string { return lineComment.ReplaceAllString(s, "") }

// plannable matches the statements EXPLAIN takes.
var plannable = regexp.MustCompile(`(?is)^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|VALUES)\b`)

var (
	// psqlSend matches the psql meta-commands that send the statement before them, as a semicolon does (\g,
	// \gset, \gx…), with their arguments.
	psqlSend = regexp.MustCompile(`(?m)\\g[a-z]*\b[^\n]*$`)
	// psqlMeta matches any other psql meta-command: from a backslash to the end of the line.
	psqlMeta = regexp.MustCompile(`(?m)\\[a-z]+.*$`)
	// psqlVar matches a psql variable, :name or :'name' (not a :: cast).
	psqlVar = regexp.MustCompile(`(^|[^:]):('?)([a-z_][a-z0-9_]*)'?`)
)

// forPlanning turns a psql script's text into plain SQL: no meta-commands, variables as literals (1, or 'null' for
// :'x': a literal that is valid text and JSON alike).
func forPlanning(text string) string {
	text = psqlSend.ReplaceAllString(text, ";")
	text = psqlMeta.ReplaceAllString(text, "")
	return psqlVar.ReplaceAllStringFunc(text, func(m string) string {
		sub := psqlVar.FindStringSubmatch(m)
		if sub[2] == "'" {
			return sub[1] + "'null'"
		}
		return sub[1] + "1"
	})
}

// TestDocsSQLPlans plans every query and data-changing statement of the pages' SQL examples against a migrated
// database.
func TestDocsSQLPlans(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	var problems []string
	planned := 0
	for _, f := range markdownFiles(t) {
		p, err := readPage(repoRoot(t)+"/"+f, f)
		require.NoError(t, err)
		for _, b := range p.blocks {
			if b.lang != "sql" {
				continue
			}
			for _, stmt := range splitSQL(forPlanning(b.text)) {
				if !plannable.MatchString(stripComments(stmt)) {
					continue
				}
				planned++
				// Each in a transaction rolled back: a plan takes locks, nothing else.
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "EXPLAIN (COSTS OFF) "+stmt)
					if err != nil {
						return err
					}
					return errRollback
				})
				if err != nil && err != errRollback {
					problems = append(problems, fmt.Sprintf("%s: %v\n    %s", b.where(), err,
						strings.ReplaceAll(stmt, "\n", "\n    ")))
				}
			}
		}
	}
	require.Empty(t, problems, "SQL examples PostgreSQL cannot plan:\n%s", strings.Join(problems, "\n"))
	require.GreaterOrEqual(t, planned, 40, "fewer SQL examples than the pages had when this test was written")
}

// errRollback ends a transaction that must leave nothing behind.
var errRollback = fmt.Errorf("rollback")

// TestSplitSQL: statements split at semicolons, not inside quotes, dollar quotes or comments.
func TestSplitSQL(t *testing.T) {
	t.Parallel()
	got := splitSQL("SELECT 'a;b'; SELECT $$x;y$$ -- c;d\n; SELECT $t$;$t$;\n-- trailing; comment\n")
	require.Equal(t, []string{"SELECT 'a;b'", "SELECT $$x;y$$ -- c;d", "SELECT $t$;$t$"}, got)
	require.Equal(t, "SELECT stepready.heartbeat_step(1, 1, 30000) ;\n\nSELECT 'null'::text, '12:00'::time, x::int",
		forPlanning("SELECT stepready.heartbeat_step(:step_id, :token, 30000) \\gset\n\\echo claimed :step_id\nSELECT :'name'::text, '12:00'::time, x::int"))
}
