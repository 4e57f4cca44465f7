package conformance

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// docTask is the task every SQL block of docs/workers.md runs against: the one its psql example asks to create.
const docTask = `{"name": "demo", "steps": [{"name": "hello", "handler": "greet", "input": {"name": "world"}}]}`

// docTaskWithRules is the demo task with an outcome rule on its step.
const docTaskWithRules = `{"name": "demo", "steps": [{"name": "hello", "handler": "greet", "input": {"name": "world"},
	"rules": [{"when": "outcome.status == 'ok'", "then": {"do": "break"}}]}]}`

// docClaim is run before a block that uses :step_id or :token (the doc says they hold a claimed row's).
const docClaim = `\set ON_ERROR_STOP on
SELECT step_id, attempt AS token FROM stepready.claim_and_start_steps(1, 'docs', 30000) \gset
`

// sqlBlock matches a fenced sql block of a Markdown page (its content in group 1).
var sqlBlock = regexp.MustCompile("(?s)\n *```sql\n(.*?)\n *```")

// TestWorkersDocSQLRuns runs every SQL block of docs/workers.md with psql, each against a database of its own
// holding the page's demo task: the complete example must leave the step complete with the greeting, every other
// block must run without an error.
func TestWorkersDocSQLRuns(t *testing.T) {
	t.Parallel()
	psql := findPsql(t)
	page, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "workers.md"))
	require.NoError(t, err)
	blocks := sqlBlock.FindAllStringSubmatch(string(page), -1)
	require.GreaterOrEqual(t, len(blocks), 8, "docs/workers.md has fewer SQL blocks than expected")
	examples := 0
	for i, m := range blocks {
		block := dedent(m[1])
		t.Run(strings.Fields(block)[0]+"_"+string(rune('a'+i)), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ctx := context.Background()
			var taskID int64
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`, docTask).Scan(&taskID))
			url := db.URL
			if strings.Contains(block, "CREATE ROLE orders_worker") {
				t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP ROLE IF EXISTS orders_worker`) })
			} else {
				// As the page says: a login role in stepready_worker, nothing more.
				url = db.LoginRole(t, "stepready_worker")
			}
			script := block
			isExample := strings.Contains(block, "claim_and_start_steps(1, 'psql-worker'")
			if !isExample && (strings.Contains(block, ":step_id") || strings.Contains(block, ":token")) {
				script = docClaim + block
			}
			out := runPsql(t, psql, url, "\\set ON_ERROR_STOP on\n"+script)
			if isExample {
				examples++
				require.Contains(t, out, "recorded \n----------\n t", "psql output:\n%s", out)
				var state, output string
				require.NoError(t, db.Pool.QueryRow(ctx, `SELECT state, output::text FROM stepready.steps WHERE task_id = $1`,
					taskID).Scan(&state, &output))
				require.Equal(t, "complete", state)
				require.JSONEq(t, `{"greeting": "hello, world"}`, output)

				// Its other branch: a step with rules is failed deterministic, not run.
				ruled := pgtest.New(t)
				require.NoError(t, ruled.Pool.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`, docTaskWithRules).Scan(&taskID))
				runPsql(t, psql, ruled.LoginRole(t, "stepready_worker"), "\\set ON_ERROR_STOP on\n"+script)
				var class string
				require.NoError(t, ruled.Pool.QueryRow(ctx, `SELECT state, last_error ->> 'class' FROM stepready.steps
					WHERE task_id = $1`, taskID).Scan(&state, &class))
				require.Equal(t, "error", state)
				require.Equal(t, "deterministic", class)
			}
		})
	}
	t.Cleanup(func() { require.Equal(t, 1, examples, "the complete psql example was not found") })
}

// runPsql runs script with psql on url and returns its output, failing the test on any error.
func runPsql(t *testing.T, psql, url, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, psql, "-X", "--no-psqlrc", "-d", url, "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	cmd.Env = append(os.Environ(), "PGOPTIONS=", "PGCONNECT_TIMEOUT=10")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "psql failed on:\n%s\noutput:\n%s", script, out)
	require.NotContains(t, string(out), "ERROR", "psql output:\n%s", out)
	return string(out)
}

// findPsql finds psql: in PATH, else beside the server binaries Debian installs.
func findPsql(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	require.NotEmpty(t, matches, "psql not found (in PATH or /usr/lib/postgresql/*/bin): install postgresql-client")
	return matches[len(matches)-1]
}

// dedent removes the indentation common to every non-empty line (blocks inside list items are indented).
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, " "))
		if indent < 0 || n < indent {
			indent = n
		}
	}
	for i, l := range lines {
		if len(l) >= indent && indent > 0 {
			lines[i] = l[indent:]
		}
	}
	return strings.Join(lines, "\n")
}
