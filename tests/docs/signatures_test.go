package docs

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// The signatures of docs/functions.md (the blocks without a language whose lines start `stepready.NAME(`) are
// held to the database's: a parameter renamed, added or retyped, a default dropped or a result column changed
// fails TestFunctionSignatures, naming the function and what differs. The short lists of design-core.md and
// cli.md (`NAME(` without the schema, results in words) are held to the database's parameters.

// signature is one function's parameters and result, as a page writes it or as PostgreSQL reports it.
type signature struct {
	name   string
	params []param
	// result is the return type, or the columns of a TABLE result ("" when the page leaves it out).
	result  string
	columns []param
}

// param is one parameter or result column: its name, its type (normalised; "" when the page leaves it out)
// and whether it has a default.
type param struct {
	name, typ  string
	hasDefault bool
}

func (p param) String() string {
	s := p.name
	if p.typ != "" {
		s += " " + p.typ
	}
	if p.hasDefault {
		s += " DEFAULT …"
	}
	return s
}

// typeAliases are the short names the docs use, and PostgreSQL's names for them.
var typeAliases = map[string]string{
	"int": "integer", "int4": "integer", "int8": "bigint", "bool": "boolean", "float8": "double precision",
	"timestamptz": "timestamp with time zone", "int2": "smallint",
}

// normaliseType gives a type its PostgreSQL name: aliases resolved, white space single, arrays as T[].
func normaliseType(t string) string {
	t = strings.Join(strings.Fields(strings.ToLower(t)), " ")
	array := strings.HasSuffix(t, "[]")
	t = strings.TrimSuffix(t, "[]")
	if a, ok := typeAliases[t]; ok {
		t = a
	}
	if array {
		t += "[]"
	}
	return t
}

// splitTop splits s at the commas outside parentheses and quotes.
func splitTop(s string) []string {
	var parts []string
	depth, quote, start := 0, false, 0
	for i, r := range s {
		switch {
		case r == '\'':
			quote = !quote
		case quote:
		case r == '(':
			depth++
		case r == ')':
			depth--
		case r == ',' && depth == 0:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	if strings.TrimSpace(s[start:]) != "" {
		parts = append(parts, s[start:])
	}
	return parts
}

// parseParams reads `p_a int, p_b text DEFAULT NULL` (a type may be left out: `task_id, step_id`).
func parseParams(s string) []param {
	var out []param
	for _, part := range splitTop(s) {
		part = strings.TrimSpace(part)
		p := param{}
		if i := strings.Index(strings.ToUpper(part), " DEFAULT "); i >= 0 {
			p.hasDefault = true
			part = part[:i]
		}
		name, typ, _ := strings.Cut(part, " ")
		p.name, p.typ = name, normaliseType(typ)
		out = append(out, p)
	}
	return out
}

// closing returns the index of the parenthesis that closes the one at s[open], or -1.
func closing(s string, open int) int {
	depth, quote := 0, false
	for i := open; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'':
			quote = !quote
		case quote:
		case c == '(':
			depth++
		case c == ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// parseResult reads what follows `→`: `bool`, `stepready.flow_limits`, `TABLE(a int, b text)`.
func parseResult(s string) (string, []param) {
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(strings.ToUpper(s), "TABLE"); ok {
		open := len(s) - len(rest) + strings.Index(rest, "(")
		if end := closing(s, open); end > 0 {
			return "TABLE", parseParams(s[open+1 : end])
		}
	}
	return normaliseType(s), nil
}

// signatureStart finds `stepready.NAME(` at the start of a line.
var signatureStart = regexp.MustCompile(`(?m)^\s*(?:stepready\.)?([a-z_][a-z0-9_]*)\(`)

// parseSignatures reads the signatures of a block: each starts a line with stepready.NAME(, its parameters may
// run over several lines, and `→ RESULT` follows (up to the next signature).
func parseSignatures(text string) ([]signature, error) {
	var out []signature
	starts := signatureStart.FindAllStringSubmatchIndex(text, -1)
	for i, m := range starts {
		end := len(text)
		if i+1 < len(starts) {
			end = starts[i+1][0]
		}
		chunk := text[m[0]:end]
		open := m[3] - m[0]
		closeAt := closing(chunk, open)
		if closeAt < 0 {
			return nil, fmt.Errorf("stepready.%s: the parameter list never closes", text[m[2]:m[3]])
		}
		sig := signature{name: text[m[2]:m[3]], params: parseParams(chunk[open+1 : closeAt])}
		if _, after, ok := strings.Cut(chunk[closeAt+1:], "→"); ok {
			sig.result, sig.columns = parseResult(strings.Join(strings.Fields(after), " "))
		}
		out = append(out, sig)
	}
	return out, nil
}

// dbSignatures are the stepready functions of the database named name, one per overload.
func dbSignatures(t *testing.T, db *pgtest.DB, name string) []signature {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		SELECT pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)
		  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname = 'stepready' AND p.proname = $1`, name)
	require.NoError(t, err)
	defer rows.Close()
	var out []signature
	for rows.Next() {
		var args, result string
		require.NoError(t, rows.Scan(&args, &result))
		sig := signature{name: name, params: parseParams(args)}
		sig.result, sig.columns = parseResult(result)
		out = append(out, sig)
	}
	require.NoError(t, rows.Err())
	return out
}

// differs says how the page's signature differs from the database's, or "" when it does not. loose compares
// the parameters only, and a parameter's default only where the page gives its type.
func differs(page, db signature, loose bool) string {
	if len(page.params) != len(db.params) {
		return fmt.Sprintf("parameters (%s), the database has (%s)", joinParams(page.params), joinParams(db.params))
	}
	for i, p := range page.params {
		d := db.params[i]
		if p.name != d.name || (p.typ != "" && p.typ != d.typ) || ((!loose || p.typ != "") && p.hasDefault != d.hasDefault) {
			return fmt.Sprintf("parameter %d is %q, the database's is %q", i+1, p.String(), d.String())
		}
	}
	if loose || page.result == "" {
		return ""
	}
	if page.result != db.result {
		return fmt.Sprintf("returns %s, the database's returns %s", page.result, db.result)
	}
	if page.result == "TABLE" {
		if len(page.columns) != len(db.columns) {
			return fmt.Sprintf("returns TABLE(%s), the database's TABLE(%s)", joinParams(page.columns), joinParams(db.columns))
		}
		for i, c := range page.columns {
			d := db.columns[i]
			if c.name != d.name || (c.typ != "" && c.typ != d.typ) {
				return fmt.Sprintf("result column %d is %q, the database's is %q", i+1, c.String(), d.String())
			}
		}
	}
	return ""
}

func joinParams(ps []param) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ", ")
}

// TestFunctionSignatures holds the signatures the docs show to the functions the database has.
func TestFunctionSignatures(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var problems []string
	checked := map[string]int{}
	for _, f := range []struct {
		file  string
		loose bool
	}{{"docs/functions.md", false}, {"docs/design-core.md", true}, {"docs/cli.md", true}} {
		problems = append(problems, checkSignatures(t, db, f.file, f.loose, checked)...)
	}
	require.Empty(t, problems, "the docs' signatures and the database's differ:\n%s", strings.Join(problems, "\n"))
	require.GreaterOrEqual(t, checked["docs/functions.md"], 30, "fewer signatures than functions.md had when this test was written")
	require.GreaterOrEqual(t, checked["docs/design-core.md"], 30, "fewer signatures than design-core.md had when this test was written")
	require.GreaterOrEqual(t, checked["docs/cli.md"], 2, "cli.md's explain signatures")
}

// checkSignatures checks the signatures of one page, counting them in checked.
func checkSignatures(t *testing.T, db *pgtest.DB, file string, loose bool, checked map[string]int) []string {
	t.Helper()
	p, err := readPage(filepath.Join(repoRoot(t), filepath.FromSlash(file)), file)
	require.NoError(t, err)
	var problems []string
	for _, b := range p.blocks {
		if b.lang != "" || !signatureStart.MatchString(b.text) {
			continue
		}
		sigs, err := parseSignatures(b.text)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", b.where(), err))
			continue
		}
		for _, s := range sigs {
			checked[file]++
			have := dbSignatures(t, db, s.name)
			if len(have) == 0 {
				problems = append(problems, fmt.Sprintf("%s: stepready.%s: no such function in the database", b.where(), s.name))
				continue
			}
			var why []string
			for _, h := range have {
				d := differs(s, h, loose)
				if d == "" {
					why = nil
					break
				}
				why = append(why, d)
			}
			if len(why) > 0 {
				problems = append(problems, fmt.Sprintf("%s: stepready.%s: %s", b.where(), s.name, strings.Join(why, "; or ")))
			}
		}
	}
	return problems
}

// TestParseSignatures: the parser of the signatures reads what the page writes and what PostgreSQL prints.
func TestParseSignatures(t *testing.T) {
	t.Parallel()
	sigs, err := parseSignatures("stepready.prune_tasks(p_finished_before timestamptz, p_statuses text[] DEFAULT '{complete,cancelled}',\n" +
		"                      p_limit int DEFAULT 1000) → int\n" +
		"stepready.flow_status(p_as_of timestamptz DEFAULT now())\n  → TABLE (key text, tokens float8)\n" +
		"stepready.clear_flow_limit(p_key text) → bool\n")
	require.NoError(t, err)
	require.Len(t, sigs, 3)
	require.Equal(t, []param{{"p_finished_before", "timestamp with time zone", false}, {"p_statuses", "text[]", true},
		{"p_limit", "integer", true}}, sigs[0].params)
	require.Equal(t, "integer", sigs[0].result)
	require.Equal(t, "TABLE", sigs[1].result)
	require.Equal(t, []param{{"key", "text", false}, {"tokens", "double precision", false}}, sigs[1].columns)
	require.Equal(t, "boolean", sigs[2].result)
	result, cols := parseResult("TABLE(task_id bigint, step_id bigint)")
	require.Equal(t, "TABLE", result)
	require.Len(t, cols, 2)
	require.Contains(t, differs(sigs[2], signature{name: "clear_flow_limit", params: []param{{"p_key", "text", false}},
		result: "integer"}, false), "returns boolean")
	require.Empty(t, differs(signature{name: "explain_step", params: []param{{"p_step_id", "", false}, {"p_as_of", "", false}}},
		signature{name: "explain_step", params: []param{{"p_step_id", "bigint", false}, {"p_as_of", "timestamp with time zone", true}},
			result: "TABLE"}, true), "loose: names alone")
}
