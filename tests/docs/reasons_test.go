package docs

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// The readiness reasons and the execution statuses are one list each, kept in SQL
// (stepready.readiness_reasons(), stepready.execution_statuses(), sql/050_readiness.sql). The docs hold them in
// one place, generated from SQL between markers; any other table of the docs that ranks them, and any paragraph
// that lists several of them, must agree with SQL. Run `go test ./tests/docs -run TestReasonLists -update` after
// changing a list to rewrite the generated tables.

var update = flag.Bool("update", false, "rewrite the tables generated from SQL in docs/")

// listItem is one row of a list function: its rank, its name and what it means.
type listItem struct {
	Rank    int32
	Name    string
	Meaning string
}

// sqlList reads a list function's rows in rank order.
func sqlList(t *testing.T, db *pgtest.DB, query string) []listItem {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), query)
	require.NoError(t, err)
	items, err := pgx.CollectRows(rows, pgx.RowToStructByPos[listItem])
	require.NoError(t, err)
	require.NotEmpty(t, items, query)
	for i, it := range items {
		require.Equal(t, int32(i+1), it.Rank, "%s: ranks 1, 2, 3…", query)
	}
	return items
}

// generatedTable renders a list as the docs show it.
func generatedTable(column, meaning string, items []listItem) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| # | `%s` | %s |\n|---|---|---|\n", column, meaning)
	for _, it := range items {
		fmt.Fprintf(&b, "| %d | `%s` | %s |\n", it.Rank, it.Name, it.Meaning)
	}
	return b.String()
}

// generated is a region of a page between `<!-- generated from SQL: NAME -->` and `<!-- end generated -->`.
func generatedRegion(name string) *regexp.Regexp {
	return regexp.MustCompile(`(?s)(<!-- generated from SQL: ` + regexp.QuoteMeta(name) + ` [^\n]*-->\n)(.*?)(<!-- end generated -->)`)
}

// TestReasonLists holds the docs to the SQL lists: the generated tables equal them, every other table that ranks
// reasons or statuses ranks them as SQL does, and a paragraph that lists several reasons lists all of them, in
// their order.
func TestReasonLists(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	lists := []struct {
		name, fn, column, meaning string
		items                     []listItem
	}{
		{name: "readiness-reasons", fn: "stepready.readiness_reasons()", column: "blocked_reason",
			meaning: "The step may not start because"},
		{name: "execution-statuses", fn: "stepready.execution_statuses()", column: "execution_status",
			meaning: "Applies when"},
	}
	root := repoRoot(t)
	generatedIn := map[string]string{}
	for i := range lists {
		l := &lists[i]
		l.items = sqlList(t, db, "SELECT rank, "+map[string]string{"readiness-reasons": "reason",
			"execution-statuses": "execution_status"}[l.name]+", meaning FROM "+l.fn+" ORDER BY rank")
	}
	for _, f := range pageFiles(t) {
		path := filepath.Join(root, f)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		text := string(data)
		changed := false
		for _, l := range lists {
			re := generatedRegion(l.name)
			for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
				generatedIn[l.name] += f + " "
				want := generatedTable(l.column, l.meaning, l.items)
				if got := text[m[4]:m[5]]; got != want {
					if !*update {
						t.Errorf("%s: the table generated from %s differs from SQL (go test ./tests/docs -run TestReasonLists -update):\n%s\nwant:\n%s",
							f, l.fn, got, want)
						continue
					}
					text = text[:m[4]] + want + text[m[5]:]
					changed = true
					break // indexes moved; one generated table per list and page
				}
			}
		}
		if changed {
			require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
		}
		p, err := parsePage(f, text)
		require.NoError(t, err)
		for _, l := range lists {
			checkRankedTables(t, f, text, l.column, l.items)
		}
		checkParagraphs(t, f, p, text, lists[0].items)
	}
	for _, l := range lists {
		require.NotEmpty(t, generatedIn[l.name], "no page holds the generated table of %s", l.fn)
	}
}

// checkRankedTables finds every Markdown table of text with a rank column (# or rank) and a column named after
// the list (or `reason`), and checks that it ranks the list's names as SQL does.
func checkRankedTables(t *testing.T, file, text, column string, items []listItem) {
	t.Helper()
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(strings.TrimSpace(lines[i]), "|") || i+1 >= len(lines) ||
			!strings.HasPrefix(strings.TrimSpace(lines[i+1]), "|---") {
			continue
		}
		header := cells(lines[i])
		rankCol, nameCol := -1, -1
		for c, h := range header {
			h = strings.ToLower(strings.Trim(h, "` "))
			switch h {
			case "#", "rank":
				rankCol = c
			case column:
				nameCol = c
			case "reason":
				if column == "blocked_reason" {
					nameCol = c
				}
			}
		}
		start := i
		i += 2
		var rows [][]string
		for ; i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "|"); i++ {
			rows = append(rows, cells(lines[i]))
		}
		if rankCol < 0 || nameCol < 0 {
			continue
		}
		var got, want []string
		for _, r := range rows {
			if rankCol < len(r) && nameCol < len(r) && strings.Trim(r[rankCol], " ") != "—" {
				got = append(got, strings.TrimSpace(r[rankCol])+" "+strings.Trim(r[nameCol], "` "))
			}
		}
		for _, it := range items {
			want = append(want, fmt.Sprintf("%d %s", it.Rank, it.Name))
		}
		require.Equal(t, want, got, "%s:%d: a table ranking %s differs from SQL's list", file, start+1, column)
	}
}

// cells splits a Markdown table row into its cells.
func cells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimPrefix(strings.TrimSuffix(row, "|"), "|")
	out := strings.Split(row, "|")
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	return out
}

// backticked matches a name in backticks.
var backticked = regexp.MustCompile("`([a-z_]+)`")

// checkParagraphs checks that a paragraph naming five or more readiness reasons (outside code blocks and tables)
// names all of them, in their order: a list of reasons written out by hand is the whole list.
func checkParagraphs(t *testing.T, file string, p *page, text string, reasons []listItem) {
	t.Helper()
	rank := map[string]int32{}
	for _, r := range reasons {
		rank[r.Name] = r.Rank
	}
	lines := strings.Split(text, "\n")
	inCode := map[int]bool{}
	for _, b := range p.blocks {
		for l := b.line; l <= b.endLine; l++ {
			inCode[l] = true
		}
	}
	from := 0
	flush := func(to int) {
		var seen []string
		have := map[string]bool{}
		for l := from; l < to; l++ {
			if inCode[l+1] || strings.HasPrefix(strings.TrimSpace(lines[l]), "|") {
				continue // code, or a table row (tables that rank reasons are checkRankedTables's)
			}
			for _, m := range backticked.FindAllStringSubmatch(lines[l], -1) {
				if _, ok := rank[m[1]]; ok && !have[m[1]] {
					have[m[1]] = true
					seen = append(seen, m[1])
				}
			}
		}
		if len(seen) < 5 {
			return
		}
		var want []string
		for _, r := range reasons {
			want = append(want, r.Name)
		}
		require.Equal(t, want, seen, "%s:%d: a paragraph that lists readiness reasons lists them all, in SQL's order (or links the list instead)",
			file, from+1)
	}
	for i, l := range lines {
		if strings.TrimSpace(l) == "" && !inCode[i+1] {
			flush(i)
			from = i + 1
		}
	}
	flush(len(lines))
}
