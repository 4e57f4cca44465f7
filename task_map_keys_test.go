package stepready_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/templates"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// A YAML definition through CreateTask (SPEC §19): a map step's concurrency key may hold ${element.PATH} and
// ${index}, kept on the map step for its elements; in a step that is not a map step they are a definition error
// naming the step and the key, and nothing is written.
func TestCreateTaskMapStepElementKeys(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	def, err := templates.ParseDefinition("fan.yaml", []byte(`
name: fan
context: {files: [{host: a, path: /x}, {host: b, path: /y}]}
steps:
  - name: fetch
    handler: noop
    input: {path: "${element.path}"}
    concurrency: {key: "host:${element.host}", limit: 1}
    rate_limit: {key: "slot:${index}", limit: 1, period_ms: 1000}
    map: {over: "${context.files}"}
`))
	require.NoError(t, err)
	id, err := stepready.CreateTask(ctx, db.Pool, def)
	require.NoError(t, err)
	var ckey, rkey string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT concurrency_key, rate_key FROM stepready.steps
		WHERE task_id = $1 AND name = 'fetch'`, id).Scan(&ckey, &rkey))
	require.Equal(t, "host:${element.host}", ckey)
	require.Equal(t, "slot:${index}", rkey)

	def, err = templates.ParseDefinition("plain.yaml", []byte(`
name: plain
steps:
  - name: fetch
    handler: noop
    concurrency: {key: "host:${element.host}", limit: 1}
`))
	require.NoError(t, err)
	_, err = stepready.CreateTask(ctx, db.Pool, def)
	require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
	require.ErrorContains(t, err, `steps[0] "fetch": concurrency: key: placeholder "${element.host}": only the elements of a map step have ${element} and ${index}`)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks WHERE name = 'plain'`).Scan(&n))
	require.Zero(t, n)
}
