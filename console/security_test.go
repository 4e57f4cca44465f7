package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// foreignNexts are next= values (as the form or the query string delivers them, decoded once) that would send a
// browser to another origin, or that no console page has; localPath maps every one to "/".
var foreignNexts = []string{
	"//evil.example/x",
	"/\t/evil.example",   // next=/%09/evil.example: browsers drop the tab and follow //evil.example
	"/\n/evil.example",   // likewise a newline
	"/\r\n/evil.example", // and CR LF
	"/\\evil.example",    // browsers read a backslash as a slash
	"/\\/evil.example",
	"\\\\evil.example",
	"/%09/evil.example", // double-encoded: decoded, a tab again
	"/%2F/evil.example", // decoded, //evil.example
	"/%5Cevil.example",  // decoded, a backslash
	"/%5C%5Cevil.example",
	"/x\x00y",
	"/x\u0085y",
	"/x\xffy",
	"https://evil.example/",
	"http:/evil.example",
	"javascript:alert(1)",
	" /evil.example",
	"evil.example",
	"",
}

// The sign-in form's next= is followed only to a page of this console (finding 8 of issue 27: next=/%09/evil.example
// was an open redirect).
func TestSignInNextStaysOnTheConsole(t *testing.T) {
	t.Parallel()
	for _, next := range foreignNexts {
		require.Equal(t, "/", localPath(next), "%q", next)
	}
	for _, next := range []string{"/", "/flow", "/tasks/3", "/tasks/3/steps/4", "/?status=error&name=a%20b",
		"/tasks?name=caf%C3%A9", "/templates#x"} {
		require.Equal(t, next, localPath(next), "%q", next)
	}

	f := newActionsFixture(t)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, next := range append(foreignNexts, "/flow?x=1") {
		if strings.ContainsRune(next, 0) {
			continue // refused before the page (TestBadQueryParametersAreRefused)
		}
		resp, err := noFollow.PostForm(f.srv.URL+"/login", url.Values{"token": {testToken}, "next": {next}})
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, "%q", next)
		require.Equal(t, localPath(next), resp.Header.Get("Location"), "%q", next)
	}
	// The attack as a link: the sign-in page carries "/" in its form instead.
	for _, raw := range []string{"/%09/evil.example", "%2F%09%2Fevil.example", "/%5Cevil", "//evil", "/%252F/evil"} {
		status, body := f.page("/login?next=" + raw)
		require.Equal(t, http.StatusOK, status, raw)
		require.Contains(t, body, `name="next" value="/"`, raw)
	}
}

// A step action acts only on a step of the task its path names (finding 8: /tasks/1/steps/2/resolve resolved
// step 2 of task 2); any other pair is a 404 and changes nothing.
func TestStepActionsCheckTheTask(t *testing.T) {
	t.Parallel()
	f := newActionsFixture(t)
	csrf := f.signIn()
	one := f.createTask(`{"name": "one", "steps": [{"name": "a", "handler": "noop"}]}`)
	two := f.createTask(`{"name": "two", "steps": [{"name": "b", "handler": "noop"}]}`)
	b := f.stepID(two, "b")
	for _, action := range []string{"resolve", "retry"} {
		for _, path := range []string{fmt.Sprintf("/tasks/%d/steps/%d/%s", one, b, action),
			fmt.Sprintf("/tasks/%d/steps/%d/%s", two, b+1000, action)} {
			status, body := f.post(path, url.Values{"csrf": {csrf}, "output": {`{"by": "hand"}`}})
			require.Equal(t, http.StatusNotFound, status, path)
			require.Contains(t, body, "has no step", path)
		}
	}
	state, _, _ := f.stepRow(b)
	require.Equal(t, "pending", state, "untouched")
	var events int
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT count(*) FROM stepready.step_events
		WHERE step_id = $1 AND event LIKE 'operator.%'`, b).Scan(&events))
	require.Zero(t, events)

	status, body := f.post(fmt.Sprintf("/tasks/%d/steps/%d/resolve", two, b), url.Values{"csrf": {csrf}, "output": {`{}`}})
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, fmt.Sprintf("step %d resolved by hand", b), "the right pair still acts")
}

// A query parameter holding NUL or invalid UTF-8 is refused with 400 and a message, on every page (finding 8: a
// task filter holding NUL was a 500).
func TestBadQueryParametersAreRefused(t *testing.T) {
	t.Parallel()
	f := newActionsFixture(t)
	id := f.createTask(`{"name": "t", "steps": [{"name": "a", "handler": "noop"}]}`)
	for _, tc := range []struct{ path, want string }{
		{"/?name=a%00b", `query parameter "name" holds a NUL character`},
		{"/?namespace=%00", `query parameter "namespace" holds a NUL character`},
		{"/?status=%00", `query parameter "status" holds a NUL character`},
		{"/?name=caf%E9", `query parameter "name" is not valid UTF-8`},
		{"/?na%FFme=x", `query parameter "na\xffme" is not valid UTF-8`},
		{fmt.Sprintf("/tasks/%d?before=%%00", id), `query parameter "before" holds a NUL character`},
		{"/login?next=/%00", `query parameter "next" holds a NUL character`},
		{"/events?task=%00", `query parameter "task" holds a NUL character`},
	} {
		status, body, _ := f.get(tc.path)
		require.Equal(t, http.StatusBadRequest, status, tc.path)
		require.Contains(t, body, tc.want, tc.path)
	}
	status, body, _ := f.get("/?name=caf%C3%A9")
	require.Equal(t, http.StatusOK, status, body)
}

// A resolve output PostgreSQL cannot store is refused with the database's own message, not "the action failed"
// (finding 8): a \u0000 in a string, a number out of jsonb's range.
func TestResolveOutputTheDatabaseRefusesShowsItsMessage(t *testing.T) {
	t.Parallel()
	f := newActionsFixture(t)
	csrf := f.signIn()
	id := f.createTask(`{"name": "t", "steps": [{"name": "a", "handler": "noop"}]}`)
	a := f.stepID(id, "a")
	for _, tc := range []struct{ output, want string }{
		{`{"x": "a\u0000b"}`, "refused: unsupported Unicode escape sequence"},
		{`{"n": 1e1000000}`, "refused: value overflows numeric format"},
	} {
		status, body := f.post(fmt.Sprintf("/tasks/%d/steps/%d/resolve", id, a), url.Values{"csrf": {csrf}, "output": {tc.output}})
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, tc.want, tc.output)
		require.NotContains(t, body, "the action failed", tc.output)
	}
	state, _, _ := f.stepRow(a)
	require.Equal(t, "pending", state)
}
