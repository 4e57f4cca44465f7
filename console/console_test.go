package console

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/readmodel"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// fixture is a migrated database with a console served over it.
type fixture struct {
	t       *testing.T
	pool    *pgxpool.Pool
	srv     *httptest.Server
	console *Console
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := pgtest.New(t)
	c, err := New(db.Pool, Options{PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(func() { c.Close(); srv.Close() })
	return &fixture{t: t, pool: db.Pool, srv: srv, console: c}
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	_, err := f.pool.Exec(f.t.Context(), sql, args...)
	require.NoError(f.t, err, sql)
}

func (f *fixture) createTask(def string) int64 {
	f.t.Helper()
	var id int64
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), `SELECT stepready.create_task($1::jsonb)`, def).Scan(&id))
	return id
}

// stepID returns the id of step name of task.
func (f *fixture) stepID(task int64, name string) int64 {
	f.t.Helper()
	var id int64
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(),
		`SELECT id FROM stepready.steps WHERE task_id = $1 AND name = $2`, task, name).Scan(&id))
	return id
}

// start moves a ready step to enqueued, as a claim does, and starts its next attempt.
func (f *fixture) start(task int64, name string) (int64, int) {
	f.t.Helper()
	id := f.stepID(task, name)
	f.exec(`UPDATE stepready.steps SET state = 'enqueued', lease_owner = 'test', lease_expires_at = now() + interval '1 minute'
		WHERE id = $1 AND state IN ('pending', 'waiting_for_retry')`, id)
	var attempt int
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), `SELECT stepready.start_step($1, 'test', 60000)`, id).Scan(&attempt))
	return id, attempt
}

func (f *fixture) complete(task int64, name string) {
	f.t.Helper()
	id, attempt := f.start(task, name)
	f.exec(`SELECT stepready.complete_step($1, $2, '{"ok": true}'::jsonb)`, id, attempt)
}

func (f *fixture) fail(task int64, name, message string) {
	f.t.Helper()
	id, attempt := f.start(task, name)
	f.exec(`SELECT * FROM stepready.fail_step($1, $2, jsonb_build_object('class', 'transient', 'message', $3::text))`,
		id, attempt, message)
}

// get fetches path and returns the status, the body and the response.
func (f *fixture) get(path string) (int, string, *http.Response) {
	f.t.Helper()
	resp, err := http.Get(f.srv.URL + path)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return resp.StatusCode, string(body), resp
}

const diamond = `{"name": "diamond", "steps": [
	{"name": "extract", "handler": "noop"},
	{"name": "transform", "handler": "noop", "depends_on": ["extract"]},
	{"name": "enrich", "handler": "noop", "depends_on": ["extract"]},
	{"name": "report", "handler": "noop", "depends_on": ["transform", "enrich"]}]}`

// nodeState matches a DAG node of the task page: its step name and state.
var nodeState = regexp.MustCompile(`<g class="node state-[a-z_]+" data-step="([^"]+)" data-state="([a-z_]+)">`)

func TestTaskPageShowsTheDiamond(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.createTask(diamond)
	f.complete(id, "extract")
	f.complete(id, "transform")
	f.fail(id, "enrich", `<b>upstream</b> said "no" & left`)

	status, body, resp := f.get(fmt.Sprintf("/tasks/%d", id))
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")
	require.NotContains(t, resp.Header.Get("Content-Security-Policy"), "unsafe-inline")

	states := map[string]string{}
	for _, m := range nodeState.FindAllStringSubmatch(body, -1) {
		states[m[1]] = m[2]
	}
	require.Equal(t, map[string]string{"extract": "complete", "transform": "complete",
		"enrich": "waiting_for_retry", "report": "pending"}, states)
	// The node text says the state and the attempts too (colour is not the only signal).
	require.Contains(t, body, "waiting_for_retry · 1/3")
	// The reasons come from explain_task.
	require.Contains(t, body, "waiting for `enrich` (waiting_for_retry, attempt 1/3)")
	// The error's HTML is text.
	require.NotContains(t, body, "<b>upstream</b>")
	require.Contains(t, body, "&lt;b&gt;upstream&lt;/b&gt;")
	// The timeline has one bar per attempt: 3 attempts.
	require.Equal(t, 3, strings.Count(body, `<rect class="bar outcome-`))
	require.Contains(t, body, "outcome-attempt-failed")
	// Events, newest first.
	require.Contains(t, body, "attempt.failed")

	// The step page.
	status, body, _ = f.get(fmt.Sprintf("/tasks/%d/steps/%d", id, f.stepID(id, "enrich")))
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "backoff")
	require.Contains(t, body, "&lt;b&gt;upstream")
	status, _, _ = f.get(fmt.Sprintf("/tasks/%d/steps/%d", id+1000, f.stepID(id, "enrich")))
	require.Equal(t, http.StatusNotFound, status)
}

func TestTasksPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.createTask(`{"name": "<script>alert(1)</script>", "namespace": "ns-x", "steps": [{"name": "a", "handler": "noop"}]}`)
	f.exec(`SELECT stepready.create_task(jsonb_build_object('name', 'bulk', 'steps',
		jsonb_build_array(jsonb_build_object('name', 'a', 'handler', 'noop')))) FROM generate_series(1, 60)`)

	_, body, _ := f.get("/?namespace=ns-x")
	require.NotContains(t, body, "<script>alert(1)")
	require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;")
	status, body, _ := f.get("/")
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "pending 61")
	require.Equal(t, pageSize, strings.Count(body, `<tr><td><a href="/tasks/`))
	next := regexp.MustCompile(`href="(/\?after=\d+)" rel="next"`).FindStringSubmatch(body)
	require.NotNil(t, next, "a next-page link")
	// Page two: the remaining 11 tasks, no further link.
	status, body, _ = f.get(strings.ReplaceAll(next[1], "&amp;", "&"))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, 11, strings.Count(body, `<tr><td><a href="/tasks/`))
	require.NotContains(t, body, `rel="next"`)

	for _, tt := range []struct {
		query string
		rows  int
	}{
		{"?namespace=ns-x", 1},
		{"?name=bulk", pageSize},
		{"?status=complete", 0},
		{"?status=pending&namespace=nope", 0},
	} {
		status, body, _ := f.get("/" + tt.query)
		require.Equal(t, http.StatusOK, status, tt.query)
		require.Equal(t, tt.rows, strings.Count(body, `<tr><td><a href="/tasks/`), tt.query)
	}

	// Search by id redirects to the task; a malformed id is a message.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(f.srv.URL + "/?id=1")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/tasks/1", resp.Header.Get("Location"))
	_, body, _ = f.get("/?id=abc")
	require.Contains(t, body, "is not a task id")
	status, _, _ = f.get("/?after=-4")
	require.Equal(t, http.StatusBadRequest, status)
}

func TestOtherPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(`INSERT INTO stepready.task_templates (name, definition) VALUES ('nightly', $1::jsonb)`,
		`{"name": "nightly", "steps": [{"name": "<i>x</i>", "handler": "noop"}]}`)

	for _, tt := range []struct {
		path   string
		status int
		want   []string
	}{
		{"/healthz", http.StatusOK, []string{"ok"}},
		{"/templates", http.StatusOK, []string{"nightly", "name: nightly", "&lt;i&gt;x&lt;/i&gt;"}},
		{"/policies", http.StatusOK, []string{`id="policy-standard"`, `class="attempt retry"`, "#1 &#43;1s", "#2 &#43;2s"}},
		{"/schedules", http.StatusOK, []string{"No schedules"}},
		{"/flow", http.StatusOK, []string{"No flow control keys"}},
		{"/tasks/999999", http.StatusNotFound, []string{"Task 999999 does not exist.", `<a href="/">`}},
		{"/tasks/1/steps/charge_card", http.StatusNotFound, []string{`Task 1 has no step &#34;charge_card&#34;.`, `<a href="/tasks/1">← Task 1</a>`}},
		{"/nope", http.StatusNotFound, []string{"No page at /nope."}},
		{"/tasks/abc", http.StatusNotFound, nil},
		{"/tasks/1?before=x", http.StatusBadRequest, nil},
		{"/static/console.css", http.StatusOK, []string{"svg.dag"}},
		{"/static/live.js", http.StatusOK, []string{"EventSource"}},
		{"/events?task=x", http.StatusBadRequest, nil},
		{"/nope", http.StatusNotFound, nil},
	} {
		status, body, _ := f.get(tt.path)
		require.Equal(t, tt.status, status, "%s: %s", tt.path, body)
		for _, w := range tt.want {
			require.Contains(t, body, w, tt.path)
		}
	}
}

// The flow page lists the keys of flow_status, every string escaped.
func TestFlowPageListsKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(`SELECT stepready.create_task('{"name": "t", "concurrency": {"key": "<tenant>", "limit": 1},
		"steps": [{"name": "a", "handler": "noop"}, {"name": "b", "handler": "noop"}]}')`)
	f.exec(`SELECT count(*) FROM stepready.claim_ready_steps(10, 'w', 60000)`)
	f.exec(`SELECT stepready.set_flow_limit('api', NULL, 5, 1000)`)
	status, body, _ := f.get("/flow")
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "<th>in flight</th>")
	require.Contains(t, body, "<td>&lt;tenant&gt;</td><td>1</td><td>1</td><td>-</td><td>-</td><td>-</td><td>1</td><td>concurrency_limited</td><td>no</td>")
	require.Contains(t, body, "<td>api</td><td>-</td><td>0</td><td>5 per 1s</td><td>5.00</td><td>-</td><td>0</td><td>-</td><td>yes</td>")
}

func TestLiveEventReachesTheStream(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.createTask(diamond)

	// Generous bounds: the event reaches the page within a poll or two; the machine may be loaded.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/events?task=%d", f.srv.URL, id), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	lines := bufio.NewScanner(resp.Body)
	require.True(t, lines.Scan()) // retry:
	// The subscription is registered before the first byte is flushed; the event happens after.
	begun := time.Now()
	f.fail(id, "extract", "boom")
	for lines.Scan() {
		if lines.Text() == "event: changed" {
			require.Less(t, time.Since(begun), 30*time.Second)
			return
		}
	}
	t.Fatalf("no changed event: %v", lines.Err())
}

func TestQueueStats(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// Many finished steps, which queue_stats must not read.
	f.exec(`WITH t AS (INSERT INTO stepready.tasks (name, status) VALUES ('done', 'complete') RETURNING id)
		INSERT INTO stepready.steps (task_id, name, handler, state, attempts, queue)
		SELECT t.id, 's' || g, 'noop', 'complete', 1, 'q1' FROM t, generate_series(1, 20000) g`)
	a := f.createTask(`{"name": "a", "steps": [{"name": "x", "handler": "noop", "queue": "q1"},
		{"name": "y", "handler": "noop", "queue": "q1"}, {"name": "z", "handler": "noop", "queue": "q2"}]}`)
	f.start(a, "y")
	f.fail(a, "z", "later")
	f.exec(`ANALYZE stepready.steps`)

	got, err := readmodel.Backlog(t.Context(), f.pool)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "q1", got[0].Queue)
	require.Equal(t, int64(1), got[0].Ready)
	require.Equal(t, int64(1), got[0].InFlight)
	require.Positive(t, got[0].OldestReadySeconds)
	require.Equal(t, "q2", got[1].Queue)
	require.Equal(t, int64(0), got[1].Ready)
	require.Equal(t, int64(1), got[1].WaitingForRetry)
	require.Equal(t, int64(1), got[1].DueWithinMinute) // standard preset: retry in 1 s
	require.Zero(t, got[1].OldestReadySeconds)

	// Never a scan of the finished rows: the plan reads the partial indexes only.
	var plan string
	require.NoError(t, f.pool.QueryRow(t.Context(), `EXPLAIN (ANALYZE, FORMAT TEXT)
		SELECT * FROM stepready.queue_stats(now())`).Scan(&plan))
	rows, err := f.pool.Query(t.Context(), `EXPLAIN (ANALYZE, COSTS OFF)
		WITH claimable AS (SELECT s.queue FROM stepready.steps s
		 WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held),
		flying AS (SELECT s.queue FROM stepready.steps s WHERE s.state IN ('enqueued', 'in_progress'))
		SELECT (SELECT count(*) FROM claimable), (SELECT count(*) FROM flying)`)
	require.NoError(t, err)
	var text strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		text.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	require.NotContains(t, text.String(), "Seq Scan", text.String())
	require.Regexp(t, `steps_(claimable|claim_order|claim_route)_idx`, text.String())
	require.Contains(t, text.String(), "steps_lease_idx")
}

func TestLayoutDAG(t *testing.T) {
	t.Parallel()
	nodes := []dagNode{{ID: 1, Name: "a"}, {ID: 2, Name: "b"}, {ID: 3, Name: "c"}, {ID: 4, Name: "d"}, {ID: 5, Name: "e"}}
	// a→b, a→c, b→d, c→d, a→d (long edge), e alone.
	l := layoutDAG(nodes, [][2]int64{{1, 2}, {1, 3}, {2, 4}, {3, 4}, {1, 4}})
	layer := map[string]int{}
	for _, n := range l.Nodes {
		layer[n.Name] = n.Layer
	}
	require.Equal(t, map[string]int{"a": 0, "b": 1, "c": 1, "d": 2, "e": 0}, layer)
	require.Len(t, l.Edges, 5)
	for _, e := range l.Edges {
		require.Less(t, e.Y1, e.Y2, "edges point down")
	}

	// Barycenter ordering removes the crossing of two parallel chains given in crossed order.
	nodes = []dagNode{{ID: 1, Name: "p"}, {ID: 2, Name: "q"}, {ID: 3, Name: "qc"}, {ID: 4, Name: "pc"}}
	l = layoutDAG(nodes, [][2]int64{{1, 4}, {2, 3}})
	x := map[string]int{}
	for _, n := range l.Nodes {
		x[n.Name] = n.X
	}
	require.Less(t, x["p"], x["q"])
	require.Less(t, x["pc"], x["qc"], "children follow their parents' order")
}

// An event whose transaction commits after a later event's still reaches the page: the live poller reads from
// a cursor that waits for the missing id (the old `id > last` read skipped it for ever).
func TestLateCommittedEventReachesTheStream(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	watched := f.createTask(diamond)
	other := f.createTask(diamond)
	// waitRead waits until the poller has read event id, then for `more` polls after that. The deadline is for a
	// machine under heavy load (a poll takes milliseconds; 5 s was once not enough at load 10).
	waitRead := func(id int64, more int) {
		deadline := time.Now().Add(30 * time.Second)
		first := -1
		for {
			read, polls := f.console.live.readUpTo(id)
			if read && first < 0 {
				first = polls
			}
			if read && polls >= first+more {
				return
			}
			require.True(t, time.Now().Before(deadline), "the poller never read event %d", id)
			<-time.After(10 * time.Millisecond)
		}
	}
	var created int64
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT COALESCE(max(id), 0) FROM stepready.step_events`).Scan(&created))
	waitRead(created, 0) // the creation events are read before the stream opens: only the late one can wake it
	insert := `INSERT INTO stepready.step_events (task_id, event, details) VALUES ($1, 'operator.test', '{}') RETURNING id`

	// The watched task's event takes the lower id and stays uncommitted while the other task's commits.
	late, err := f.pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = late.Rollback(context.WithoutCancel(t.Context())) }()
	var lateID, earlyID int64
	require.NoError(t, late.QueryRow(t.Context(), insert, watched).Scan(&lateID))
	require.NoError(t, f.pool.QueryRow(t.Context(), insert, other).Scan(&earlyID))
	require.Greater(t, earlyID, lateID)

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/events?task=%d", f.srv.URL, watched), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	require.True(t, lines.Scan()) // retry:
	// Let the poller read past the other task's event, and poll twice more, before the late commit.
	waitRead(earlyID, 2)
	require.NoError(t, late.Commit(t.Context()))
	for lines.Scan() {
		if lines.Text() == "event: changed" {
			return
		}
	}
	t.Fatalf("the late event never reached the stream: %v", lines.Err())
}

// The step page shows the input as defined and as resolved now, and the deps (SPEC §18), escaped.
func TestStepPageDataFlow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.createTask(`{"name": "flow", "context": {"who": "<i>ann</i>"}, "steps": [
		{"name": "list", "handler": "noop"},
		{"name": "report", "handler": "noop", "depends_on": ["list"], "input": {"first": "${deps.list.n}", "who": "${context.who}"}}]}`)
	page := fmt.Sprintf("/tasks/%d/steps/%d", id, f.stepID(id, "report"))
	status, body, _ := f.get(page)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "Its references do not resolve yet: input reference ${deps.list.n}: deps.list.n not found")
	f.exec(`UPDATE stepready.steps SET state = 'complete', attempts = 1, output = '{"n": 7}' WHERE id = $1`, f.stepID(id, "list"))
	status, body, _ = f.get(page)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, `<pre id="input-resolved">{&#34;who&#34;: &#34;&lt;i&gt;ann&lt;/i&gt;&#34;, &#34;first&#34;: 7}</pre>`)
	require.Contains(t, body, `<pre id="deps">{&#34;list&#34;: {&#34;n&#34;: 7}}</pre>`)
}
