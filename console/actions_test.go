package console

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

const testToken = "s3cret-token"

// actionsFixture is a console with actions allowed, and a browser-like client (cookie jar, no redirects
// followed automatically unless asked).
type actionsFixture struct {
	*fixture
	client *http.Client
	reg    *prometheus.Registry // the console's collectors
}

func newActionsFixture(t *testing.T) *actionsFixture {
	t.Helper()
	db := pgtest.New(t)
	reg := prometheus.NewRegistry()
	c, err := New(db.Pool, Options{PollInterval: 50 * time.Millisecond, AllowActions: true, Token: testToken,
		Registerer: reg})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(func() { c.Close(); srv.Close() })
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &actionsFixture{fixture: &fixture{t: t, pool: db.Pool, srv: srv}, client: &http.Client{Jar: jar}, reg: reg}
}

// do sends a request with the client (following redirects) and returns status and body.
func (f *actionsFixture) do(req *http.Request) (int, string) {
	f.t.Helper()
	resp, err := f.client.Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return resp.StatusCode, string(b)
}

func (f *actionsFixture) post(path string, form url.Values) (int, string) {
	f.t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(f.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return f.do(req)
}

func (f *actionsFixture) page(path string) (int, string) {
	f.t.Helper()
	req, err := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
	require.NoError(f.t, err)
	return f.do(req)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// signIn logs in with the form and returns the CSRF token of the session.
func (f *actionsFixture) signIn() string {
	f.t.Helper()
	status, body := f.post("/login", url.Values{"token": {testToken}, "next": {"/"}})
	require.Equal(f.t, http.StatusOK, status, body)
	m := csrfField.FindStringSubmatch(body)
	require.NotNil(f.t, m, "no csrf field once signed in: %s", body)
	return m[1]
}

func (f *actionsFixture) stepRow(id int64) (state string, attempts, maxAttempts int) {
	f.t.Helper()
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), `SELECT state, attempts, max_attempts FROM stepready.steps
		WHERE id = $1`, id).Scan(&state, &attempts, &maxAttempts))
	return
}

func TestActionsNeedAToken(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := New(db.Pool, Options{AllowActions: true})
	require.ErrorIs(t, err, ErrNoToken)
}

func TestSignInAndOut(t *testing.T) {
	t.Parallel()
	f := newActionsFixture(t)
	status, body := f.page("/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `id="signin"`)
	require.NotContains(t, body, `name="csrf"`)

	status, body = f.page("/login?next=/flow")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `name="token"`)
	status, body = f.post("/login", url.Values{"token": {"wrong"}, "next": {"/flow"}})
	require.Equal(t, http.StatusUnauthorized, status)
	require.Contains(t, body, "That token is not the console")

	// A foreign next is not followed.
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).
		PostForm(f.srv.URL+"/login", url.Values{"token": {testToken}, "next": {"//evil.example/x"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/", resp.Header.Get("Location"))
	var ck *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie {
			ck = c
		}
	}
	require.NotNil(t, ck)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.NotContains(t, ck.Value, testToken, "the cookie never holds the token")

	csrf := f.signIn()
	status, body = f.page("/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "Sign out")
	// Logout needs the CSRF token.
	status, _ = f.post("/logout", url.Values{})
	require.Equal(t, http.StatusForbidden, status)
	status, body = f.post("/logout", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `id="signin"`)
}

func TestBearerSignsIn(t *testing.T) {
	t.Parallel()
	f := newActionsFixture(t)
	id := f.createTask(`{"name": "t", "steps": [{"name": "a", "handler": "noop"}]}`)
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/tasks/%d/pause", f.srv.URL, id), nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	status, body := f.do(req)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, fmt.Sprintf("task %d paused", id))
	var paused bool
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT paused FROM stepready.tasks WHERE id = $1`, id).Scan(&paused))
	require.True(t, paused)
	// The redirect was followed with the session cookie the bearer request got.
	require.Contains(t, body, "Sign out")

	req, _ = http.NewRequest(http.MethodPost, fmt.Sprintf("%s/tasks/%d/resume", f.srv.URL, id), nil)
	req.Header.Set("Authorization", "Bearer nope")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}

func TestEveryActionAndItsRefusal(t *testing.T) {
	t.Parallel()
	f := newActionsFixture(t)
	csrf := f.signIn()
	id := f.createTask(`{"name": "t", "steps": [{"name": "a", "handler": "noop", "retry": {"max_attempts": 1}},
		{"name": "b", "handler": "noop", "depends_on": ["a"]}]}`)
	a := f.stepID(id, "a")
	f.fail(id, "a", "boom <b>")
	form := url.Values{"csrf": {csrf}}

	// Retry the failed step: one more attempt, recorded with actor ui.
	status, body := f.post(fmt.Sprintf("/tasks/%d/steps/%d/retry", id, a), form)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, fmt.Sprintf("step %d will be retried now", a))
	state, attempts, maxAttempts := f.stepRow(a)
	require.Contains(t, []string{"pending", "waiting_for_retry"}, state, "ready again")
	require.Equal(t, 1, attempts)
	require.Equal(t, 2, maxAttempts)
	var actor string
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT details ->> 'actor' FROM stepready.step_events
		WHERE step_id = $1 AND event = 'operator.retry_now'`, a).Scan(&actor))
	require.Equal(t, "ui", actor)

	// A refusal is a message on the page, not an error page: retrying a pending step is allowed, resolving a
	// complete one is not.
	f.complete(id, "a")
	status, body = f.post(fmt.Sprintf("/tasks/%d/steps/%d/resolve", id, a), url.Values{"csrf": {csrf}, "output": {`{"x": 1}`}})
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "refused: cannot resolve step")
	require.Contains(t, body, `class="flash error"`)
	// Bad JSON for resolve is refused before the database.
	b := f.stepID(id, "b")
	status, body = f.post(fmt.Sprintf("/tasks/%d/steps/%d/resolve", id, b), url.Values{"csrf": {csrf}, "output": {`{oops`}})
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "the output must be a JSON document")
	status, body = f.post(fmt.Sprintf("/tasks/%d/steps/%d/resolve", id, b), url.Values{"csrf": {csrf}, "output": {`{"by": "<hand>"}`}})
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, fmt.Sprintf("step %d resolved by hand", b))
	state, _, _ = f.stepRow(b)
	require.Equal(t, "resolved_manually", state)

	// Task actions on a second task.
	id2 := f.createTask(`{"name": "u", "steps": [{"name": "x", "handler": "noop"}]}`)
	for _, tc := range []struct{ action, want string }{
		{"pause", fmt.Sprintf("task %d paused", id2)},
		{"resume", fmt.Sprintf("task %d resumed", id2)},
		{"reset", "refused: cannot reset task"},
		{"cancel", fmt.Sprintf("task %d cancelled", id2)},
		{"cancel", "refused: cannot cancel task"},
		{"reset", fmt.Sprintf("task %d reset", id2)},
	} {
		status, body = f.post(fmt.Sprintf("/tasks/%d/%s", id2, tc.action), form)
		require.Equal(t, http.StatusOK, status, tc.action)
		require.Contains(t, body, tc.want, tc.action)
	}
	var n int
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT count(*) FROM stepready.step_events WHERE task_id = $1
		AND event LIKE 'operator.%' AND details ->> 'actor' = 'ui'`, id2).Scan(&n))
	require.GreaterOrEqual(t, n, 5)

	// Unknown ids and actions.
	status, body = f.post("/tasks/999999/pause", form)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "refused: task 999999 does not exist")
	status, _ = f.post(fmt.Sprintf("/tasks/%d/explode", id2), form)
	require.Equal(t, http.StatusNotFound, status)
}

func TestForgedPostsAreRefused(t *testing.T) {
	t.Parallel()
	f := newActionsFixture(t)
	id := f.createTask(`{"name": "t", "steps": [{"name": "a", "handler": "noop"}]}`)
	// No session.
	status, _ := f.post(fmt.Sprintf("/tasks/%d/cancel", id), url.Values{})
	require.Equal(t, http.StatusForbidden, status)
	// A session but no or a wrong CSRF token (what a cross-site form would send, were the cookie sent).
	f.signIn()
	status, _ = f.post(fmt.Sprintf("/tasks/%d/cancel", id), url.Values{})
	require.Equal(t, http.StatusForbidden, status)
	status, _ = f.post(fmt.Sprintf("/tasks/%d/cancel", id), url.Values{"csrf": {strings.Repeat("0", 64)}})
	require.Equal(t, http.StatusForbidden, status)
	var st string
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT status FROM stepready.tasks WHERE id = $1`, id).Scan(&st))
	require.Equal(t, "pending", st)
}

// Without actions, no form is drawn and every POST is refused.
func TestReadOnlyConsoleHasNoActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.createTask(`{"name": "t", "steps": [{"name": "a", "handler": "noop"}]}`)
	f.fail(id, "a", "x")
	_, body, _ := f.get(fmt.Sprintf("/tasks/%d", id))
	require.NotContains(t, body, "<form")
	require.NotContains(t, body, "Sign in")
	for _, path := range []string{fmt.Sprintf("/tasks/%d/cancel", id), fmt.Sprintf("/tasks/%d/steps/%d/retry", id, f.stepID(id, "a")), "/login"} {
		resp, err := http.PostForm(f.srv.URL+path, url.Values{"token": {"x"}})
		require.NoError(t, err)
		resp.Body.Close()
		require.Contains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, resp.StatusCode, path)
	}
}

// The console as the roles of SPEC §17: stepready_reader reads every page and can act on nothing (the action
// fails, the task is untouched); stepready_operator's actions go through.
func TestConsoleRoles(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var id int64
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT stepready.create_task('{"name": "t",
		"steps": [{"name": "a", "handler": "noop"}]}')`).Scan(&id))
	for _, tc := range []struct {
		role   string
		paused bool
	}{{"stepready_reader", false}, {"stepready_operator", true}} {
		pool, err := pgxpool.New(t.Context(), db.LoginRole(t, tc.role))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		c, err := New(pool, Options{AllowActions: true, Token: testToken, PollInterval: 50 * time.Millisecond})
		require.NoError(t, err)
		srv := httptest.NewServer(c)
		t.Cleanup(func() { c.Close(); srv.Close() })
		jar, _ := cookiejar.New(nil)
		f := &actionsFixture{fixture: &fixture{t: t, pool: db.Pool, srv: srv}, client: &http.Client{Jar: jar}}
		for _, path := range []string{"/", fmt.Sprintf("/tasks/%d", id), "/templates", "/policies", "/schedules", "/flow"} {
			status, body := f.page(path)
			require.Equal(t, http.StatusOK, status, "%s %s: %s", tc.role, path, body)
		}
		csrf := f.signIn()
		status, body := f.post(fmt.Sprintf("/tasks/%d/pause", id), url.Values{"csrf": {csrf}})
		require.Equal(t, http.StatusOK, status, body)
		var paused bool
		require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT paused FROM stepready.tasks WHERE id = $1`, id).Scan(&paused))
		require.Equal(t, tc.paused, paused, tc.role)
		if !tc.paused {
			require.Contains(t, body, "refused: permission denied for function pause_task: grant one of [stepready_operator] to this role")
		}
	}
}

// sends reads stepready_signal_sends_total{via, outcome} from the console's registry.
func (f *actionsFixture) sends(via, outcome string) int {
	f.t.Helper()
	families, err := f.reg.Gather()
	require.NoError(f.t, err)
	for _, fam := range families {
		if fam.GetName() != "stepready_signal_sends_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["via"] == via && labels["outcome"] == outcome {
				return int(m.GetCounter().GetValue())
			}
		}
	}
	return 0
}
