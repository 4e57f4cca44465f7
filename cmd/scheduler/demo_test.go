package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestDemoPrintsTheLiveAccount(t *testing.T) {
	t.Parallel()
	for _, dispatch := range []string{"direct", "river"} {
		t.Run(dispatch, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			stdout, stderr, err := executeIsolated(context.Background(), t,
				"demo", "--exit-when-done", "--database-url", db.URL, "--dispatch", dispatch)
			require.NoError(t, err, "stderr:\n%s\nstdout:\n%s", stderr, stdout)

			for _, pattern := range []string{
				// A retry with the standard preset's delays: 1 s, then 2 s.
				`flaky#\d+ +call_api +attempt 1 failed \(transient: fail handler: attempt 1 of 2 fails\) — retry in 1000 ms`,
				`flaky#\d+ +call_api +attempt 2 failed \(transient: fail handler: attempt 2 of 2 fails\) — retry in 2000 ms`,
				`flaky#\d+ +call_api +attempt 3 started`,
				`task flaky#\d+ complete`,
				// Completed tasks.
				`diamond#\d+ +report +completed`,
				`task diamond#\d+ complete`,
				// Aggressive preset exhausted, the step skipped, its dependent still runs.
				`exhausts#\d+ +optional_sync +attempt 4 failed \(transient: upstream keeps timing out\) — retry in 1600 ms`,
				`exhausts#\d+ +optional_sync +attempt 5 failed \(transient: upstream keeps timing out\) — retries exhausted`,
				`exhausts#\d+ +optional_sync +skipped \(retries exhausted; on_exhausted: skip\)`,
				`exhausts#\d+ +publish +completed`,
				`task exhausts#\d+ complete`,
				// A permanent failure: no retry, the task is in error.
				`permanent#\d+ +charge_card +attempt 1 failed \(permanent: card declined\) — not retryable`,
				`task permanent#\d+ error`,
				// The summary.
				// Data between steps (SPEC §18).
				`dataflow#\d+ +report +completed`,
				`dataflow#\d+ +complete +list: complete · pick: complete · report: complete`,
				// Map steps: each element worked like a step, the map step's output in element order.
				`fanout#\d+ +resize\[2\] +completed`,
				`fanout#\d+ +complete +list: complete · resize: complete \(3 of 3 elements\) · join: complete`,
				// Waiting for the world (SPEC §20): approve waits for its signal, which the demo sends itself
				// after a few seconds; the sleep after it ends on the daemon's timer.
				`approval#\d+ +approve +waiting for signal approved \(until `,
				`approval#\d+ +- +signal approved \(#\d+\) received from demo`,
				`approval#\d+ +approve +completed by signal approved`,
				`approval#\d+ +cool_off +sleeping until `,
				`approval#\d+ +complete +charge: complete · approve: complete · cool_off: complete · ship: complete`,
				`summary: 7 tasks in `,
				`flaky#\d+ +complete +call_api: complete after 3 attempts`,
				`permanent#\d+ +error +charge_card: error after 1 attempt \(permanent, not retryable\) · ship_order: pending`,
			} {
				require.Regexp(t, pattern, stdout)
			}

			// The DAG order: report starts after both of its parents completed.
			report := lineIndex(t, stdout, `diamond#\d+ +report +attempt 1 started`)
			require.Greater(t, report, lineIndex(t, stdout, `diamond#\d+ +transform +completed`))
			require.Greater(t, report, lineIndex(t, stdout, `diamond#\d+ +enrich +completed`))
			require.NotContains(t, stdout, "ship_order  ", "the step after a permanent failure never runs")

			// The signal arrives demoSignalDelay after approve started waiting, and ship runs after the sleep.
			waiting := lineIndex(t, stdout, `approval#\d+ +approve +waiting for signal approved`)
			require.Greater(t, lineIndex(t, stdout, `approval#\d+ +approve +completed by signal`), waiting)
			require.Greater(t, lineIndex(t, stdout, `approval#\d+ +ship +attempt 1 started`),
				lineIndex(t, stdout, `approval#\d+ +cool_off +completed`))
		})
	}
}

// lineIndex returns the index of the first line of text that matches pattern.
func lineIndex(t *testing.T, text, pattern string) int {
	t.Helper()
	re := regexp.MustCompile(pattern)
	for i, line := range strings.Split(text, "\n") {
		if re.MatchString(line) {
			return i
		}
	}
	t.Fatalf("no line matches %s", pattern)
	return -1
}

func TestDemoRejectsABadTemplateBeforeTouchingTheDatabase(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "broken.yaml"), []byte("name: a\nname: b\n"), 0o644))

	_, _, err := executeIsolated(context.Background(), t, "demo", "--exit-when-done", "--examples", dir,
		"--database-url", "postgres://x@127.0.0.1:1/x")
	require.ErrorContains(t, err, "broken.yaml")
	require.ErrorContains(t, err, `mapping key "name" already defined`)
}

func TestDemoRejectsBadFlags(t *testing.T) {
	t.Parallel()
	_, _, err := executeIsolated(context.Background(), t, "demo", "--dispatch", "carrier-pigeon")
	require.ErrorContains(t, err, `--dispatch "carrier-pigeon"`)
	require.Equal(t, 2, exitCode(err))
}
