package integration

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// The reference parser lives in SQL (sql/019_dataflow.sql: _ref_parse, used by the creation checks and by the
// resolution at start); these tests drive it from Go. FuzzInputReferences takes any string (committed corpus in
// testdata/fuzz/FuzzInputReferences); TestInputReferencesRandom is its bounded run in `make test`: 400 strings
// built from the pieces references are made of, with a fixed seed.

// fuzzScope is the deps, context and task id every fuzzed string is resolved against.
const (
	fuzzDeps    = `{"p": {"s": "text", "n": 2, "b": false, "z": null, "a": [1, {"k": "v"}], "o": {"k": "v"}}}`
	fuzzContext = `{"region": "eu", "list": ["x", "y"], "deep": {"er": {"est": 1}}}`
)

// checkReferenceText holds the parser's properties for one string, used as the whole of a step's input:
//   - nothing raises: the parse, the creation check and the resolution each answer for any text;
//   - a text without `${` is plain: no reference, no problem, resolved to itself;
//   - when the parse finds no problem and the text has no `$$`, its pieces put back together are the text;
//   - the creation check accepts exactly the texts whose references all parse and name the parent p (or
//     context or task), and a text it accepts resolves, or fails only for a path that names nothing or an
//     object inside a longer string, never for its syntax.
func checkReferenceText(t *testing.T, db *pgtest.DB, text string) {
	t.Helper()
	if !utf8.ValidString(text) || strings.ContainsRune(text, 0) {
		return // not a PostgreSQL text
	}
	ctx := context.Background()
	var refs, problems int
	var joined string
	rows, err := db.Pool.Query(ctx, `SELECT COALESCE(lit, ref), ref IS NOT NULL, problem FROM stepready._ref_parse($1)`, text)
	require.NoError(t, err, "parse of %q", text)
	for rows.Next() {
		var piece, problem *string
		var isRef bool
		require.NoError(t, rows.Scan(&piece, &isRef, &problem))
		if problem != nil {
			problems++
			continue
		}
		joined += *piece
		if isRef {
			refs++
		}
	}
	require.NoError(t, rows.Err(), "parse of %q", text)
	if !strings.Contains(text, "${") {
		require.Zero(t, refs+problems, "a text without ${ has no reference: %q", text)
	}
	if problems == 0 && !strings.Contains(text, "$$") {
		require.Equal(t, text, joined, "the pieces of %q put back together", text)
	}

	input, err := json.Marshal(map[string]string{"v": text})
	require.NoError(t, err)
	var creationProblem, value, resolveProblem *string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready._input_refs_problem($1::jsonb, ARRAY['p']),
		r.value::text, r.problem FROM stepready._resolve_input($1::jsonb, $2::jsonb, $3::jsonb, 42) r`,
		string(input), fuzzDeps, fuzzContext).Scan(&creationProblem, &value, &resolveProblem),
		"check and resolution of %q", text)
	if !strings.Contains(text, "${") {
		require.Nil(t, creationProblem, "%q", text)
		require.Nil(t, resolveProblem, "%q", text)
		require.JSONEq(t, string(input), *value, "a text without references is kept: %q", text)
		return
	}
	// A parse problem is a creation problem (the check may name another problem of the text first, such as a
	// reference to a step that is not a direct parent: "${deps.0}${context"); a text that parses is refused at
	// creation only for what its references name.
	if problems > 0 {
		require.NotNil(t, creationProblem, "a parse problem is a creation problem: %q", text)
	} else if creationProblem != nil {
		require.True(t, strings.Contains(*creationProblem, "direct parent") ||
			strings.Contains(*creationProblem, "map step"),
			"a text that parses is refused only for what it names: %q (%s)", text, *creationProblem)
	}
	if creationProblem == nil {
		if resolveProblem != nil {
			require.True(t, strings.HasPrefix(*resolveProblem, "input reference ") ||
				strings.Contains(*resolveProblem, "must name a scalar"),
				"a text accepted at creation fails at start only for its value: %q: %s", text, *resolveProblem)
		} else {
			require.NotNil(t, value, "%q", text)
		}
	}
	require.True(t, (value == nil) != (resolveProblem == nil), "a value or a problem: %q", text)

	// _resolve_value looks a string that is exactly one reference up without the parser (_ref_whole), alone, as
	// an object's member or an array's item: what it gives is always what the parser's _resolve_string gives.
	var strValue, strProblem, aloneValue, aloneProblem, arrayValue, arrayProblem *string
	require.NoError(t, db.Pool.QueryRow(ctx, `WITH scope AS (SELECT jsonb_build_object('deps', $2::jsonb,
			'context', $3::jsonb, 'task', jsonb_build_object('id', 42)) AS s)
		SELECT p.value::text, p.problem, a.value::text, a.problem, l.value::text, l.problem
		  FROM scope, stepready._resolve_string($1, scope.s) p, stepready._resolve_value(to_jsonb($1::text), scope.s) a,
		       stepready._resolve_value(jsonb_build_array($1::text, 'x'), scope.s) l`,
		text, fuzzDeps, fuzzContext).Scan(&strValue, &strProblem, &aloneValue, &aloneProblem, &arrayValue, &arrayProblem),
		"resolution of %q", text)
	require.Equal(t, strProblem, aloneProblem, "alone: %q", text)
	require.Equal(t, strProblem, arrayProblem, "in an array: %q", text)
	require.Equal(t, strProblem, resolveProblem, "in an object: %q", text)
	if strValue != nil {
		require.JSONEq(t, *strValue, *aloneValue, "alone: %q", text)
		require.JSONEq(t, `[`+*strValue+`, "x"]`, *arrayValue, "in an array: %q", text)
		require.JSONEq(t, `{"v": `+*strValue+`}`, *value, "in an object: %q", text)
	}
}

// FuzzInputReferences: see checkReferenceText.
func FuzzInputReferences(f *testing.F) {
	db := pgtest.New(f)
	for _, s := range referenceSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		checkReferenceText(t, db, text)
	})
}

// referenceSeeds are the committed seeds beside testdata/fuzz/FuzzInputReferences: one of each rule.
var referenceSeeds = []string{
	"plain", "", "${deps.p}", "${deps.p.a.1.k}", "${deps.p.a.-1.k}", "x ${deps.p.s} y ${context.region}",
	"${deps.p.o} inside", "${deps.q.x}", "${deps.p.nope}", "${deps}", "${deps.p", "${deps..x}", "${task.id}",
	"${task.name}", "${index}", "${element.id}", "$${deps.p}", "$$${deps.p.s}", "${HOME}", "${contextual}",
	"${context}", "${context.deep.er.est}-${task.id}", "${deps.p.z}", "${ deps.p }", "${deps.p.s}}", "}${",
	"${deps.p.${deps.p.s}}", "é${context.list.0}€", "${task.id.x}", "${index.0}", "${deps.p.}", "${.p}",
	"${context.list.-1}", "${deps.p.a}", "${element}",
}

// TestInputReferencesRandom is the bounded run of FuzzInputReferences: strings assembled at random from the
// pieces of references (roots, separators, braces, dollars, indexes, names), fixed seed.
func TestInputReferencesRandom(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pieces := []string{"${", "$${", "$", "{", "}", ".", "deps", "context", "task", "element", "index", "p", "q",
		"s", "n", "a", "o", "id", "0", "1", "-1", "region", "list", "nope", " ", "x", "é", "..", "${deps.p.",
		"${context.", "}}"}
	r := rand.New(rand.NewPCG(21, 18))
	for range 400 {
		var b strings.Builder
		for range 1 + r.IntN(10) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		checkReferenceText(t, db, b.String())
	}
}
