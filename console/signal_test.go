package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// approval is a task whose step approve waits for the signal "approved" at once, and whose step later waits for
// "later" behind a handler step that has not run (a signal for it is buffered).
const approval = `{"name": "approval", "idempotency_key": "order-7", "steps": [
	{"name": "approve", "wait": {"signal": "approved", "timeout_ms": 3600000}},
	{"name": "ship", "handler": "noop", "depends_on": ["approve"]},
	{"name": "first", "handler": "noop"},
	{"name": "later", "depends_on": ["first"], "wait": {"signal": "later"}},
	{"name": "nap", "wait": {"duration_ms": 7200000}}]}`

// api posts body to /api/signals with the bearer token (unless token is empty) and returns the status and the
// decoded JSON answer.
func (f *actionsFixture) api(token, body string) (int, map[string]any) {
	f.t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/api/signals", strings.NewReader(body))
	require.NoError(f.t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	status, text := f.do(req)
	var out map[string]any
	require.NoError(f.t, json.Unmarshal([]byte(text), &out), "the answer is JSON: %s", text)
	return status, out
}

func (f *actionsFixture) signalCount(task int64) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), `SELECT count(*) FROM stepready.signals WHERE task_id = $1`,
		task).Scan(&n))
	return n
}

// signalOutcome returns the state and output of step name of task, and the actor of the signal.received event of
// signal id.
func (f *actionsFixture) signalOutcome(task int64, name string, id int64) (state, output, actor string) {
	f.t.Helper()
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), `SELECT s.state, s.output::text,
		(SELECT e.details ->> 'actor' FROM stepready.step_events e
		  WHERE e.task_id = s.task_id AND e.event = 'signal.received' AND (e.details ->> 'signal_id')::bigint = $3)
		FROM stepready.steps s WHERE s.task_id = $1 AND s.name = $2`, task, name, id).Scan(&state, &output, &actor))
	return state, output, actor
}

// POST /api/signals (SPEC §20, issue 22): the bearer token, a bad body named by its field, an unknown task, a
// refused signal, a delivered one (201 with its id, the step complete with the payload), an idempotent repeat.
func TestSignalAPI(t *testing.T) {
	t.Parallel()
	f := newActionsFixture(t)
	task := f.createTask(approval)
	body := fmt.Sprintf(`{"task_id": %d, "name": "approved", "payload": {"by": "ada", "note": "\"quoted\" é"}}`, task)

	// Without the token, with another one, or with the session cookie of a signed-in browser: refused.
	status, out := f.api("", body)
	require.Equal(t, http.StatusUnauthorized, status)
	require.Equal(t, "authorization", out["field"])
	status, _ = f.api("wrong", body)
	require.Equal(t, http.StatusUnauthorized, status)
	f.signIn()
	status, _ = f.api("", body)
	require.Equal(t, http.StatusUnauthorized, status, "a session cookie is not enough for the API")
	require.Zero(t, f.signalCount(task))

	for _, c := range []struct{ body, field, says string }{
		{`not json`, "body", "not a JSON object"},
		{``, "body", "empty"},
		{`{"task_id": 1, "name": "x"} {}`, "body", "more than one"},
		{`{"task_id": "seven", "name": "approved"}`, "task_id", "task_id"},
		{`{"task_id": 1, "name": "approved", "colour": "red"}`, "colour", `unknown field "colour"`},
		{`{"name": "approved"}`, "task_id", "task_id or task_key is required"},
		{fmt.Sprintf(`{"task_id": %d, "task_key": "order-7", "name": "approved"}`, task), "task_id", "not both"},
		{fmt.Sprintf(`{"task_id": %d}`, task), "name", "name is required"},
		{fmt.Sprintf(`{"task_id": %d, "name": "approved", "idempotency_key": ""}`, task), "idempotency_key", "empty"},
	} {
		status, out := f.api(testToken, c.body)
		require.Equal(t, http.StatusBadRequest, status, c.body)
		require.Equal(t, c.field, out["field"], c.body)
		require.Contains(t, out["error"], c.says, c.body)
	}

	status, out = f.api(testToken, `{"task_id": 999999, "name": "approved"}`)
	require.Equal(t, http.StatusNotFound, status, out)
	require.Equal(t, "task_id", out["field"])
	status, out = f.api(testToken, `{"task_key": "no-such-key", "name": "approved"}`)
	require.Equal(t, http.StatusNotFound, status, out)
	require.Equal(t, "task_key", out["field"])
	status, out = f.api(testToken, fmt.Sprintf(`{"task_id": %d, "name": "nobody-waits"}`, task))
	require.Equal(t, http.StatusConflict, status, out)
	require.Equal(t, "name", out["field"])
	status, out = f.api(testToken, fmt.Sprintf(`{"task_id": %d, "name": "approved", "payload": "\u0000"}`, task))
	require.Equal(t, http.StatusBadRequest, status, out)
	require.Equal(t, "payload", out["field"])
	status, out = f.api(testToken, fmt.Sprintf(`{"task_id": %d, "name": "%s"}`, task, strings.Repeat("n", 256)))
	require.Equal(t, http.StatusBadRequest, status, out)
	require.Equal(t, "name", out["field"])
	require.Contains(t, out["error"], "at most 255 characters")
	f.exec(`UPDATE stepready.settings SET value = '50' WHERE name = 'max_output_bytes'`)
	status, out = f.api(testToken, fmt.Sprintf(`{"task_id": %d, "name": "approved", "payload": "%s"}`, task,
		strings.Repeat("x", 60)))
	require.Equal(t, http.StatusRequestEntityTooLarge, status, out)
	require.Equal(t, "payload", out["field"])
	require.Contains(t, out["error"], "over the limit of 50 bytes")
	f.exec(`UPDATE stepready.settings SET value = '1048576' WHERE name = 'max_output_bytes'`)
	require.Zero(t, f.signalCount(task), "nothing was kept of the refusals")
	// Refusals leave nothing in the database: the console counts them (unauthorized requests are not sends).
	require.Equal(t, 1, f.sends("api", "refused"))
	require.Equal(t, 2, f.sends("api", "not_found"))
	require.Equal(t, 12, f.sends("api", "invalid"))
	require.Zero(t, f.sends("api", "sent"))

	// Delivered: the step completes with the payload as its output.
	status, out = f.api(testToken, body)
	require.Equal(t, http.StatusCreated, status, out)
	id := int64(out["id"].(float64))
	require.Positive(t, id)
	state, output, actor := f.signalOutcome(task, "approve", id)
	require.Equal(t, "complete", state)
	require.JSONEq(t, `{"by": "ada", "note": "\"quoted\" é"}`, output)
	require.Equal(t, "api", actor)
	require.Equal(t, 1, f.sends("api", "sent"))

	// By the task's key, with an idempotency key, buffered (later's parent has not run): a repeat answers the
	// first id and adds nothing.
	keyed := `{"task_key": "order-7", "name": "later", "payload": [1, 2], "idempotency_key": "hook-1"}`
	status, out = f.api(testToken, keyed)
	require.Equal(t, http.StatusCreated, status, out)
	first := out["id"]
	status, out = f.api(testToken, keyed)
	require.Equal(t, http.StatusCreated, status, out)
	require.Equal(t, first, out["id"])
	require.Equal(t, 2, f.signalCount(task))
}

// A read-only console has no API, and a console whose role may only read refuses to send (403, with the roles
// that may).
func TestSignalAPIReadOnlyAndRoles(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	task := f.createTask(approval)
	resp, err := http.Post(f.srv.URL+"/api/signals", "application/json",
		strings.NewReader(fmt.Sprintf(`{"task_id": %d, "name": "approved"}`, task)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Contains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, resp.StatusCode)

	db := pgtest.New(t)
	reader, err := pgxpool.New(t.Context(), db.LoginRole(t, "stepready_reader"))
	require.NoError(t, err)
	t.Cleanup(reader.Close)
	c, err := New(reader, Options{AllowActions: true, Token: testToken, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	var id int64
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT stepready.create_task($1::jsonb)`, approval).Scan(&id))
	req := httptest.NewRequest(http.MethodPost, "/api/signals",
		strings.NewReader(fmt.Sprintf(`{"task_id": %d, "name": "approved"}`, id)))
	req.Header.Set("Authorization", "Bearer "+testToken)
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, req)
	require.Equal(t, http.StatusForbidden, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "stepready_")
}

// The step page of a wait step says what it waits for and lists the mailbox; with actions its form sends the
// signal with actor "ui": bad JSON and a name nobody waits for are refused with a message, a good one completes
// the step; the form needs the CSRF token and a step of that task.
func TestSignalForm(t *testing.T) {
	t.Parallel()
	f := newActionsFixture(t)
	task := f.createTask(approval)
	approve, later, nap := f.stepID(task, "approve"), f.stepID(task, "later"), f.stepID(task, "nap")
	stepPath := fmt.Sprintf("/tasks/%d/steps/%d", task, approve)

	// Read-only until signed in: what it waits for, no form.
	status, body := f.page(stepPath)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `<b class="signal-name">approved</b>`)
	require.Contains(t, body, "at most 1h0m0s from when it starts waiting (then it fails with class timeout)")
	require.Contains(t, body, `id="wait-until"`)
	require.NotContains(t, body, `id="signal-form"`)
	_, body = f.page(fmt.Sprintf("/tasks/%d/steps/%d", task, later))
	require.Contains(t, body, "It starts waiting when its parents are done")
	_, body = f.page(fmt.Sprintf("/tasks/%d/steps/%d", task, nap))
	require.Contains(t, body, "A sleep for 2h0m0s.")
	require.Contains(t, body, "it wakes at")

	csrf := f.signIn()
	_, body = f.page(stepPath)
	require.Contains(t, body, `id="signal-form"`)
	require.Contains(t, body, `name="name" value="approved"`)
	_, body = f.page(fmt.Sprintf("/tasks/%d/steps/%d", task, nap))
	require.NotContains(t, body, `id="signal-form"`, "a sleep has no signal to send")

	send := func(form url.Values) string {
		t.Helper()
		form.Set("csrf", csrf)
		form.Set("step", fmt.Sprint(approve))
		status, body := f.post(fmt.Sprintf("/tasks/%d/signal", task), form)
		require.Equal(t, http.StatusOK, status, body)
		return body
	}
	body = send(url.Values{"name": {"approved"}, "payload": {"{not json"}})
	require.Contains(t, body, "refused: the payload must be a JSON document")
	body = send(url.Values{"name": {"nobody-waits"}, "payload": {"{}"}})
	require.Contains(t, body, `class="flash error"`)
	require.Contains(t, body, "refused: ")
	require.Zero(t, f.signalCount(task))

	body = send(url.Values{"name": {"approved"}, "payload": {`{"by": "<b>ada</b>"}`}, "idempotency_key": {"k"}})
	require.Contains(t, body, `signal &#34;approved&#34; sent to task`)
	require.Contains(t, body, "&lt;b&gt;ada&lt;/b&gt;", "the mailbox shows the payload, escaped")
	require.Contains(t, body, `id="mailbox"`)
	var id int64
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT id FROM stepready.signals WHERE task_id = $1`, task).Scan(&id))
	state, output, actor := f.signalOutcome(task, "approve", id)
	require.Equal(t, "complete", state)
	require.JSONEq(t, `{"by": "<b>ada</b>"}`, output)
	require.Equal(t, "ui", actor)
	require.Equal(t, []int{1, 1, 1}, []int{f.sends("ui", "invalid"), f.sends("ui", "refused"), f.sends("ui", "sent")},
		"the form's sends by outcome: invalid, refused, sent")
	_, body = f.page(stepPath)
	require.NotContains(t, body, `id="signal-form"`, "a finished step has no form")

	// Without the CSRF token: 403. With a step of another task: 404, nothing sent.
	status, _ = f.post(fmt.Sprintf("/tasks/%d/signal", task), url.Values{"name": {"later"}})
	require.Equal(t, http.StatusForbidden, status)
	other := f.createTask(strings.Replace(approval, `"order-7"`, `"order-8"`, 1))
	status, _ = f.post(fmt.Sprintf("/tasks/%d/signal", other),
		url.Values{"csrf": {csrf}, "name": {"approved"}, "step": {fmt.Sprint(approve)}})
	require.Equal(t, http.StatusNotFound, status)
	require.Zero(t, f.signalCount(other))
}
