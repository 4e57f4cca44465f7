package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
)

// TestPrune: --dry-run counts and deletes nothing; without it the finished tasks of the statuses go; unfinished
// tasks stay; bad flags are usage errors.
func TestPrune(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	for _, name := range []string{"a", "b", "c"} {
		b.exec(`SELECT stepready.create_task($1::jsonb)`, `{"name": "`+name+`", "steps": [{"name": "s", "handler": "noop"}]}`)
	}
	b.exec(`SELECT stepready.cancel_task(1, 'old', now() - interval '2 hours')`)
	b.exec(`SELECT stepready.cancel_task(2, 'new', now())`)

	stdout, stderr, err := b.run("prune", "--older-than", "1h", "--dry-run", "-o", "json")
	require.NoError(t, err, stderr)
	var res stepready.PruneResult
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))
	require.Equal(t, 1, res.Pruned)
	require.True(t, res.DryRun)
	require.Equal(t, int64(3), b.int64(`SELECT count(*) FROM stepready.tasks`), "a dry run deletes nothing")

	stdout, stderr, err = b.run("prune", "--older-than", "1h")
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, "1 task pruned: complete, cancelled, finished before ")
	require.Equal(t, int64(0), b.int64(`SELECT count(*) FROM stepready.tasks WHERE id = 1`))

	stdout, _, err = b.run("prune", "--older-than", "0s", "--status", "complete")
	require.NoError(t, err)
	require.Contains(t, stdout, "0 tasks pruned: complete,")
	stdout, _, err = b.run("prune", "--older-than", "0s", "--status", "cancelled,error")
	require.NoError(t, err)
	require.Contains(t, stdout, "1 task pruned")
	require.Equal(t, int64(1), b.int64(`SELECT count(*) FROM stepready.tasks`), "the pending task stays")

	_, _, err = b.run("prune", "--older-than", "1h", "--status", "pending")
	require.ErrorContains(t, err, `--status "pending": want a comma-separated list of complete, cancelled, error`)
	_, _, err = b.run("prune")
	require.ErrorContains(t, err, "--older-than is required")
}

// A dry run checks the privileges of the real run: an operator, who may not prune, is refused by the dry run
// too, with the role that may (it used to count, then the real run was refused).
func TestPruneDryRunChecksThePrivilege(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	url := b.db.LoginRole(t, "stepready_operator")
	_, _, err := executeIsolated(t.Context(), t, "prune", "--older-than", "1h", "--dry-run", "--database-url", url)
	require.ErrorContains(t, err, "permission denied for function stepready.prune_tasks")
	require.ErrorContains(t, err, "stepready_worker")
}
