package console

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mapTask creates list → m (a map step over n elements) → join, fans m out and starts three of its elements,
// completing the first two; it returns the task and m's id.
func (f *fixture) mapTask(n int) (int64, int64) {
	f.t.Helper()
	var task int64
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), `SELECT stepready.create_task(jsonb_build_object(
		'name', 'fan', 'steps', jsonb_build_array(
			jsonb_build_object('name', 'm', 'handler', 'work', 'map', jsonb_build_object('over',
				(SELECT jsonb_agg(jsonb_build_object('n', g)) FROM generate_series(1, $1::int) g))),
			jsonb_build_object('name', 'join', 'handler', 'noop', 'depends_on', jsonb_build_array('m')))))`, n).
		Scan(&task))
	m := f.stepID(task, "m")
	f.exec(`SELECT count(*) FROM stepready.claim_and_start_steps(10, 'w', 60000)`) // fans out
	f.exec(`SELECT count(*) FROM stepready.claim_and_start_steps(3, 'w', 60000)`)
	f.exec(`SELECT stepready.complete_step(id, 1, jsonb_build_object('text', repeat('x', 200), 'i', element_index))
		FROM stepready.steps WHERE map_step_id = $1 AND element_index < 2`, m)
	return task, m
}

// The task page draws a map step as one node with a progress bar and lists it as one row; its elements are
// neither nodes nor rows.
func TestTaskPageMapStepIsOneNode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	task, m := f.mapTask(60)
	status, body, _ := f.get(fmt.Sprintf("/tasks/%d", task))
	require.Equal(t, http.StatusOK, status)

	nodes := nodeState.FindAllStringSubmatch(body, -1)
	require.Len(t, nodes, 2, "m and join, no element")
	require.Equal(t, "m", nodes[0][1])
	require.Contains(t, body, `<g class="map-progress" data-done="2" data-total="60" data-failed="0" data-in-flight="1">`)
	// 2 of 60 done: 154 * 2 / 60 = 5 units of the bar.
	require.Regexp(t, `<rect class="map-done" x="\d+" y="\d+" width="5" height="5">`, body)
	require.Contains(t, body, "in_progress · 2/60 elements")
	require.Contains(t, body, "2/60 elements, 1 in flight, 0 failed")
	require.NotContains(t, body, `data-step="m[0]"`)
	require.Equal(t, 2, strings.Count(body, `<tr data-step="`))
	require.Contains(t, body, fmt.Sprintf(`href="/tasks/%d/steps/%d"`, task, m))
}

// A map step's page lists its elements a page at a time (state, attempt, output cut); an element's page links
// back to its map step.
func TestStepPageListsElements(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	task, m := f.mapTask(60)
	status, body, _ := f.get(fmt.Sprintf("/tasks/%d/steps/%d", task, m))
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "2 of 60 elements complete, 1 in flight, 0 failed")
	rows := regexp.MustCompile(`<tr data-element="(\d+)">`).FindAllStringSubmatch(body, -1)
	require.Len(t, rows, pageSize)
	require.Equal(t, "0", rows[0][1])
	require.Contains(t, body, `<span class="state state-complete">complete</span></td><td>1/3</td>`)
	require.Contains(t, body, `<span class="state state-in_progress">in_progress</span></td><td>1/3</td>`)
	// The output is cut at 80 characters on the list.
	require.Contains(t, body, "<code>{&#34;i&#34;: 0, &#34;text&#34;: &#34;xxxx")
	require.NotContains(t, body, strings.Repeat("x", 100))
	next := regexp.MustCompile(`href="(/tasks/\d+/steps/\d+\?after=49)" rel="next"`).FindStringSubmatch(body)
	require.NotNil(t, next, "a next page of elements")

	status, body, _ = f.get(next[1])
	require.Equal(t, http.StatusOK, status)
	rows = regexp.MustCompile(`<tr data-element="(\d+)">`).FindAllStringSubmatch(body, -1)
	require.Len(t, rows, 10)
	require.Equal(t, "50", rows[0][1])
	require.NotContains(t, body, `rel="next"`)

	status, body, _ = f.get(fmt.Sprintf("/tasks/%d/steps/%d", task, f.stepID(task, "m[1]")))
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, fmt.Sprintf(`Element 1 of <a href="/tasks/%d/steps/%d">its map step</a>`, task, m))
	require.NotContains(t, body, `id="elements"`)

	status, _, _ = f.get(fmt.Sprintf("/tasks/%d/steps/%d?after=x", task, m))
	require.Equal(t, http.StatusBadRequest, status)
}
