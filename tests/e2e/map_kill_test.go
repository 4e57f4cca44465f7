package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMapKillMidMapLosesNoElement (RELIABILITY #15): a daemon process works a map step of 10,000 elements and is
// killed with SIGKILL part-way; a second daemon process finishes it. The map step's output holds every element's
// output exactly once, in element order. Every element's handler finished at least once, and more than once only
// for the elements the killed daemon held at the kill (their leases expired and were reaped), never more than
// twice; no (element, attempt) was started twice.
//
// The array is a literal in the map's definition, not ${context.items}: every row that starts an attempt carries
// its task's context (SPEC §18), so a context holding the 10,000 items would send ~130 kB with each element
// (10,000 × 130 kB), which is what this test would then measure (~50 s a mode alone instead of ~10 s). What is
// checked here does not depend on where the array came from: the fan-out reads it once either way.
func TestMapKillMidMapLosesNoElement(t *testing.T) {
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testMapKillMidMap(t, mode)
		})
	}
}

func testMapKillMidMap(t *testing.T, mode string) {
	const elements = 10000
	b := setup(t)
	ctx := context.Background()
	items := make([]string, elements)
	for i := range items {
		items[i] = fmt.Sprintf(`{"n": %d}`, 7*i)
	}
	taskID := b.createTask(t, `{"name": "mapkill", "steps": [
		{"name": "m", "handler": "element", "map": {"over": [`+strings.Join(items, ",")+`], "max_in_flight": 50}}]}`)
	var mapID int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT id FROM stepready.steps WHERE task_id = $1 AND name = 'm'`,
		taskID).Scan(&mapID))
	runLog := filepath.Join(t.TempDir(), "runs")

	mapDone := func() int {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT COALESCE(map_done, 0) FROM stepready.steps WHERE id = $1`,
			mapID).Scan(&n))
		return n
	}
	// The first daemon's connections carry an application_name of their own (the later childEnv wins), so that
	// the test can wait for them to end after the kill (below).
	firstURL, err := url.Parse(b.db.URL)
	require.NoError(t, err)
	q := firstURL.Query()
	q.Set("application_name", "mapkill-first-"+mode)
	firstURL.RawQuery = q.Encode()
	first := startChild(t, b, mode, childRunLogEnv+"="+runLog, childEnv+"="+firstURL.String())
	// Deadlines for a busy machine: alone, a mode takes ~2 s to the kill and ~8 s after it; the package's test
	// binary has 10 minutes in all (go test's default), and both modes run at once.
	deadline := time.Now().Add(3 * time.Minute)
	// Kill once a fifth is done and the daemon holds elements (it works in claims of a few at a time).
	for {
		var done, holding int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT (SELECT COALESCE(map_done, 0) FROM stepready.steps WHERE id = $1),
			(SELECT count(*) FROM stepready.steps WHERE map_step_id = $1 AND state = 'in_progress')`, mapID).
			Scan(&done, &holding))
		if done >= elements/5 && holding > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "fewer than %d elements done before the kill (%d)", elements/5, done)
		<-time.After(2 * time.Millisecond)
	}
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	// A statement the killed daemon had sent still runs to its end on the server (its backend notices the closed
	// socket only when it writes the result): a claim committed then hands elements to the dead daemon after
	// the kill. Its backends gone, what it holds is settled.
	for {
		var backends int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE application_name = $1`, "mapkill-first-"+mode).Scan(&backends))
		if backends == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the killed daemon's connections still open (%d)", backends)
		<-time.After(10 * time.Millisecond)
	}

	// The elements the killed daemon held: only these may run a second time.
	held := map[int]bool{}
	rows, err := b.db.Pool.Query(ctx, `SELECT element_index FROM stepready.steps
		WHERE map_step_id = $1 AND state IN ('enqueued', 'in_progress')`, mapID)
	require.NoError(t, err)
	for rows.Next() {
		var i int
		require.NoError(t, rows.Scan(&i))
		held[i] = true
	}
	require.NoError(t, rows.Err())
	doneAtKill := mapDone()
	require.Less(t, doneAtKill, elements, "the kill came after the map had finished")
	t.Logf("%s: killed with %d elements done and %d held", mode, doneAtKill, len(held))

	second := startChild(t, b, mode, childRunLogEnv+"="+runLog)
	deadline = time.Now().Add(4 * time.Minute)
	for {
		var state string
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT state FROM stepready.steps WHERE id = $1`, mapID).Scan(&state))
		if state == "complete" {
			break
		}
		require.NotEqual(t, "error", state, "the map step failed")
		require.True(t, time.Now().Before(deadline), "map step not complete after the restart (%s, %d done)", state, mapDone())
		<-time.After(50 * time.Millisecond)
	}
	require.NoError(t, second.Process.Signal(syscall.SIGTERM))
	require.NoError(t, second.Wait())

	// Every element's output once, in element order.
	var n, wrong int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT jsonb_array_length(output),
		(SELECT count(*) FROM jsonb_array_elements(s.output) WITH ORDINALITY AS a(v, o)
		  WHERE v IS DISTINCT FROM jsonb_build_object('i', o - 1, 'e', jsonb_build_object('n', 7 * (o - 1))))
		FROM stepready.steps s WHERE id = $1`, mapID).Scan(&n, &wrong))
	require.Equal(t, elements, n, "outputs in the map step's output")
	require.Zero(t, wrong, "outputs not in element order or not the element's")
	var out []json.RawMessage
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT output FROM stepready.steps WHERE id = $1`, mapID).Scan(&out))
	require.Len(t, out, elements)

	// Handler runs: at least one per element; a second only for an element held at the kill; never a third.
	f, err := os.Open(runLog)
	require.NoError(t, err)
	defer f.Close()
	runs := make([]int, elements)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		require.Len(t, fields, 2, "run log line %q", sc.Text())
		i, err := strconv.Atoi(fields[0])
		require.NoError(t, err)
		require.True(t, i >= 0 && i < elements, "run log index %d", i)
		runs[i]++
	}
	require.NoError(t, sc.Err())
	again := 0
	for i, r := range runs {
		require.GreaterOrEqual(t, r, 1, "element %d never ran its handler to the end", i)
		require.LessOrEqual(t, r, 2, "element %d ran its handler %d times", i, r)
		if r == 2 {
			again++
			require.True(t, held[i], "element %d ran twice but the killed daemon did not hold it", i)
		}
	}
	t.Logf("%s: %d elements ran their handler twice (held at the kill: %d)", mode, again, len(held))

	var twice []string
	rows, err = b.db.Pool.Query(ctx, `SELECT format('element %s attempt %s started %s times', s.element_index, e.attempt, count(*))
		FROM stepready.step_events e JOIN stepready.steps s ON s.id = e.step_id
		WHERE s.map_step_id = $1 AND e.event = 'attempt.started' GROUP BY s.element_index, e.attempt HAVING count(*) > 1`, mapID)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		twice = append(twice, s)
	}
	require.NoError(t, rows.Err())
	require.Empty(t, twice, "an (element, attempt) started twice")
	var overAttempted int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps
		WHERE map_step_id = $1 AND (state <> 'complete' OR attempts > 2 OR (attempts = 2 AND NOT element_index = ANY ($2)))`,
		mapID, heldList(held)).Scan(&overAttempted))
	require.Zero(t, overAttempted, "elements not complete, past a second attempt, or retried without being held at the kill")
}

func heldList(held map[int]bool) []int32 {
	out := make([]int32, 0, len(held))
	for i := range held {
		out = append(out, int32(i))
	}
	return out
}
