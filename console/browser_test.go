package console

// Tests in a real browser: chromedp drives Chromium (Debian's chromium package) against the console. Locally
// they skip when no Chromium is installed; in CI (CI=true) they fail instead, so a broken install cannot pass
// silently. STEPREADY_SCREENSHOTS=DIR (make screenshots) also writes the documentation's PNGs into DIR.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// chromiumPath finds the browser: $CHROMIUM, then the usual names on PATH.
func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// newBrowser starts a headless Chromium for t and returns a tab's context, ended with t.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("browser tests: no Chromium found in CI (install the chromium package; .ci/run does)")
		}
		t.Skip("browser tests: no Chromium installed (apt-get install chromium)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancelTab := chromedp.NewContext(allocCtx)
	// Start the browser now (with no deadline: it lives as long as this first call's context), so that a
	// browser that cannot start fails here, clearly.
	if err := chromedp.Do(tab); err != nil {
		cancelTab()
		cancelAlloc()
		t.Fatalf("browser tests: Chromium %s does not start: %v", path, err)
	}
	ctx, cancelTimeout := context.WithTimeout(tab, 60*time.Second)
	t.Cleanup(func() { cancelTimeout(); cancelTab(); cancelAlloc() })
	return ctx
}

// screenshot writes a full-page PNG named name when STEPREADY_SCREENSHOTS names a directory.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("STEPREADY_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
}

// nodeStates reads the DAG's nodes as the browser shows them: step name → state text.
func nodeStates(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	states, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](`(() => {
		const out = {};
		for (const g of document.querySelectorAll("svg.dag g.node")) {
			out[g.querySelector("text.name").textContent] = g.querySelector("text.meta").textContent.split(" · ")[0];
		}
		return out;
	})()`))
	require.NoError(t, err)
	return states
}

func TestBrowserTaskPage(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	f := newFixture(t)
	id := f.createTask(diamond)
	f.complete(id, "extract")
	f.start(id, "transform")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", f.srv.URL, id)),
		chromedp.WaitVisible("svg.dag")))
	require.Equal(t, map[string]string{"extract": "complete", "transform": "in_progress", "enrich": "pending",
		"report": "pending"}, nodeStates(t, ctx))

	// A step failing now turns red without a reload: the node's fill is the error colour of console.css.
	f.fail(id, "enrich", "<b>not bold</b>")
	f.exec(`UPDATE stepready.steps SET next_attempt_at = now() WHERE task_id = $1 AND name = 'enrich'`, id)
	f.fail(id, "enrich", "<b>not bold</b>")
	f.exec(`UPDATE stepready.steps SET next_attempt_at = now() WHERE task_id = $1 AND name = 'enrich'`, id)
	changed := time.Now()
	f.fail(id, "enrich", "<b>not bold</b>")
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`svg.dag g.node[data-state="error"]`)))
	fill, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`getComputedStyle(document.querySelector('svg.dag g.node[data-state="error"] rect')).fill`))
	require.NoError(t, err)
	t.Logf("the failed step turned red %s after its event", time.Since(changed).Round(time.Millisecond))
	require.Equal(t, "rgb(246, 192, 192)", fill)
	require.Equal(t, "error", nodeStates(t, ctx)["enrich"])

	// The error's HTML is shown as text, not markup.
	errText, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`document.querySelector('#steps tr[data-step="enrich"] td.error').textContent`))
	require.NoError(t, err)
	bolds, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#steps b").length`))
	require.NoError(t, err)
	require.Contains(t, errText, "<b>not bold</b>")
	require.Zero(t, bolds)
	screenshot(t, ctx, "console-task.png")
}

func TestBrowserEscapingAndPages(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	f := newFixture(t)
	name := `<script>document.title="pwned"</script>`
	f.createTask(fmt.Sprintf(`{"name": %q, "steps": [{"name": "a", "handler": "noop"}]}`, name))
	for range 3 {
		f.createTask(diamond)
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.srv.URL+"/"), chromedp.WaitVisible("#tasks")))
	title, err := chromedp.Run(ctx, chromedp.Title())
	require.NoError(t, err)
	cell, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`document.querySelector("#tasks tbody tr:last-child td:nth-child(2)").textContent`))
	require.NoError(t, err)
	require.Equal(t, "Tasks · stepready", title)
	require.Equal(t, name, strings.TrimSpace(cell))
	screenshot(t, ctx, "console-tasks.png")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.srv.URL+"/policies"),
		chromedp.WaitVisible("#policy-standard svg")))
	marks, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#policy-standard circle").length`))
	require.NoError(t, err)
	require.Equal(t, 3, marks)
	screenshot(t, ctx, "console-policies.png")
}

// With actions and the token: sign in through the form, click "Retry now" on the failed step, and the step row
// changes in the database.
func TestBrowserRetryAction(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	f := newActionsFixture(t)
	id := f.createTask(`{"name": "t", "steps": [{"name": "a", "handler": "noop", "retry": {"max_attempts": 1}}]}`)
	step := f.stepID(id, "a")
	f.fail(id, "a", "boom")
	state, _, _ := f.stepRow(step)
	require.Equal(t, "error", state)

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", f.srv.URL, id)),
		chromedp.WaitVisible("#signin"),
		chromedp.Click("#signin"),
		chromedp.WaitVisible(`input[name="token"]`),
		chromedp.SendKeys(`input[name="token"]`, testToken),
		chromedp.Submit(`input[name="token"]`),
		chromedp.WaitVisible("button.retry"),
	))
	screenshot(t, ctx, "console-actions.png")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click("button.retry"), chromedp.WaitVisible("#flash")))
	flashText, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("flash").textContent`))
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("step %d will be retried now", step), flashText)

	deadline := time.Now().Add(10 * time.Second)
	for {
		state, attempts, maxAttempts := f.stepRow(step)
		if state != "error" {
			require.Contains(t, []string{"pending", "waiting_for_retry"}, state, "ready again")
			require.Equal(t, 1, attempts)
			require.Equal(t, 2, maxAttempts, "exactly one more attempt")
			break
		}
		require.False(t, time.Now().After(deadline), "the step is still %s", state)
		<-time.After(20 * time.Millisecond)
	}
}

// Without the token the retry button is absent, and a POST forged from the page is refused: by a read-only
// console (no such route) and by a console with actions whose visitor has not signed in.
func TestBrowserNoTokenNoAction(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	for _, withActions := range []bool{false, true} {
		var srvURL string
		var task, step int64
		var stateOf func() string
		if withActions {
			f := newActionsFixture(t)
			task = f.createTask(`{"name": "t", "steps": [{"name": "a", "handler": "noop", "retry": {"max_attempts": 1}}]}`)
			step = f.stepID(task, "a")
			f.fail(task, "a", "boom")
			srvURL = f.srv.URL
			stateOf = func() string { s, _, _ := f.stepRow(step); return s }
		} else {
			f := newFixture(t)
			task = f.createTask(`{"name": "t", "steps": [{"name": "a", "handler": "noop", "retry": {"max_attempts": 1}}]}`)
			step = f.stepID(task, "a")
			f.fail(task, "a", "boom")
			srvURL = f.srv.URL
			stateOf = func() string {
				var s string
				require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT state FROM stepready.steps WHERE id = $1`, step).Scan(&s))
				return s
			}
		}
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", srvURL, task)),
			chromedp.WaitVisible("#steps")))
		buttons, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("button.retry, form").length`))
		require.NoError(t, err)
		require.Zero(t, buttons, "actions %v: a form without the token", withActions)
		status, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`fetch("/tasks/%d/steps/%d/retry", {
			method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "csrf=forged"
		}).then(r => r.status)`, task, step), chromedp.EvalAwaitPromise))
		require.NoError(t, err)
		require.Contains(t, []int{403, 404, 405}, status, "actions %v: the forged POST", withActions)
		require.Equal(t, "error", stateOf(), "actions %v: the forged POST changed the step", withActions)
	}
}

// A map step in the browser: one node whose progress bar is drawn green in proportion to its elements done, and
// its page's element list paged with its next link.
func TestBrowserMapStep(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	f := newFixture(t)
	task, m := f.mapTask(60)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", f.srv.URL, task)),
		chromedp.WaitVisible("svg.dag g.map-progress")))
	require.Equal(t, map[string]string{"m": "in_progress", "join": "pending"}, nodeStates(t, ctx))
	bar, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]any](`(() => {
		const done = document.querySelector("svg.dag g.map-progress rect.map-done");
		const track = document.querySelector("svg.dag g.map-progress rect.map-track");
		return {done: done.getBBox().width, track: track.getBBox().width, fill: getComputedStyle(done).fill};
	})()`))
	require.NoError(t, err)
	require.Equal(t, map[string]any{"done": float64(5), "track": float64(154), "fill": "rgb(46, 139, 46)"}, bar)
	screenshot(t, ctx, "console-map-task.png")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/tasks/%d/steps/%d", f.srv.URL, task, m)),
		chromedp.WaitVisible("#elements")))
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#elements tbody tr").length`))
	require.NoError(t, err)
	require.Equal(t, pageSize, rows)
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(`a[rel="next"]`),
		chromedp.WaitVisible(`#elements tr[data-element="50"]`)))
	rows, err = chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#elements tbody tr").length`))
	require.NoError(t, err)
	require.Equal(t, 10, rows)
	screenshot(t, ctx, "console-map-elements.png")
}

// Issue 22, SPEC §20: open a waiting step's page, sign in, send its signal through the form with a payload, and
// the page comes back with the step complete, its output the payload, and the signal in the mailbox.
func TestBrowserSendSignal(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	f := newActionsFixture(t)
	id := f.createTask(`{"name": "refund", "steps": [
		{"name": "approve", "wait": {"signal": "approved", "timeout_ms": 3600000}},
		{"name": "ship", "handler": "noop", "depends_on": ["approve"], "input": {"by": "${deps.approve.by}"}}]}`)
	step := f.stepID(id, "approve")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fmt.Sprintf("%s/tasks/%d/steps/%d", f.srv.URL, id, step)),
		chromedp.WaitVisible("#waits"),
		chromedp.Click("#signin"),
		chromedp.WaitVisible(`input[name="token"]`),
		chromedp.SendKeys(`input[name="token"]`, testToken),
		chromedp.Submit(`input[name="token"]`),
		chromedp.WaitVisible("#signal-form"),
	))
	state, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector(".summary .state").textContent`))
	require.NoError(t, err)
	require.Equal(t, "waiting", state)
	name, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#signal-form input[name="name"]').value`))
	require.NoError(t, err)
	require.Equal(t, "approved", name, "the name is prefilled")
	screenshot(t, ctx, "console-signal.png")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(`#signal-form textarea[name="payload"]`, `{"by": "ada"}`),
		chromedp.Click("button.send-signal"),
		chromedp.WaitVisible("#flash"),
		chromedp.WaitVisible("#mailbox"),
	))
	flashText, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("flash").textContent`))
	require.NoError(t, err)
	require.Contains(t, flashText, fmt.Sprintf(`signal "approved" sent to task %d`, id))
	state, err = chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector(".summary .state").textContent`))
	require.NoError(t, err)
	require.Equal(t, "complete", state, "the step completed with the signal")
	mailbox, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("mailbox").textContent`))
	require.NoError(t, err)
	require.Contains(t, mailbox, "approve")
	require.Contains(t, mailbox, `{"by": "ada"}`)
	stateDB, _, _ := f.stepRow(step)
	require.Equal(t, "complete", stateDB)
}
