package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// The templates of TestBehindPgBouncer: a diamond whose b fails twice (retried after 50 ms); a step that fails
// once and waits an hour for its retry (retried now by an operator), one that always fails (resolved by an
// operator); the task a schedule fires every second; one that starts in an hour (paused, resumed, cancelled).
const (
	pgbDiamond = `name: pgb-diamond
steps:
  - {name: a, handler: noop}
  - {name: b, handler: fail, input: {times: 2, class: transient}, depends_on: [a],
     retry: {max_attempts: 4, backoff: fixed, base_delay_ms: 50}}
  - {name: c, handler: noop, depends_on: [a]}
  - {name: d, handler: noop, depends_on: [b, c]}
`
	pgbOnce = `name: pgb-once
steps:
  - {name: s, handler: fail, input: {times: 1, class: transient},
     retry: {max_attempts: 2, backoff: fixed, base_delay_ms: 3600000}}
`
	pgbNever = `name: pgb-never
steps:
  - {name: s, handler: fail, input: {times: 1000, class: transient},
     retry: {max_attempts: 5, backoff: fixed, base_delay_ms: 3600000}}
`
	pgbTick  = "name: pgb-tick\nsteps:\n  - {name: s, handler: noop}\n"
	pgbLater = "name: pgb-later\nsteps:\n  - {name: s, handler: noop}\n"
	pgbToken = "pgb-token"
)

// startBackground runs the command line in the background in an empty environment, logging into a buffer, until
// the test ends or stop is called; stop returns its log and its error.
func startBackground(t *testing.T, args ...string) (stop func() (string, error)) {
	t.Helper()
	log := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	root := newRootCommandWith(&globalOptions{
		stdout:    log,
		stderr:    log,
		lookupEnv: func(string) (string, bool) { return "", false },
		exit:      func(code int) { t.Errorf("exit(%d) called", code) },
	})
	root.SetArgs(args)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	var once sync.Once
	var err error
	stop = func() (string, error) {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				err = fmt.Errorf("scheduler %s did not stop", args[0])
			}
		})
		return log.String(), err
	}
	t.Cleanup(func() { _, _ = stop() })
	return stop
}

// TestBehindPgBouncer (issue 24): everything works through a real PgBouncer in transaction pooling mode with
// plain URLs (no default_query_exec_mode, nothing but user, host and database): `scheduler run --poll-only` in
// both dispatch modes runs tasks (created by the CLI, from templates and by a schedule that fires every
// second) with retries, a DAG and pruning; the CLI's read and operator commands work, and operator events say
// actor cli; `scheduler ui` serves every page and acts (actor ui). No log (the daemon's, the console's,
// PgBouncer's) mentions a prepared statement or a refused startup parameter.
func TestBehindPgBouncer(t *testing.T) {
	t.Parallel()
	for _, dispatch := range []string{"direct", "river"} {
		t.Run(dispatch, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)
			workerRole, operatorRole := db.LoginRole(t, "stepready_worker"), db.LoginRole(t, "stepready_operator")
			bouncer := pgtest.PgBouncer(t, db.URL, workerRole, operatorRole)
			adminURL, workerURL, operatorURL := bouncer.URL(t, db.URL), bouncer.URL(t, workerRole), bouncer.URL(t, operatorRole)

			var transcript strings.Builder
			cli := func(url string, args ...string) string {
				t.Helper()
				stdout, stderr, err := executeIsolated(ctx, t, append(args, "--database-url", url)...)
				require.NoError(t, err, "scheduler %v through PgBouncer: %s", args, stderr)
				transcript.WriteString(stderr)
				return stdout
			}
			createTask := func(args ...string) int64 {
				t.Helper()
				var res struct {
					TaskID int64 `json:"task_id"`
				}
				out := cli(adminURL, append([]string{"task", "create", "--output", "json"}, args...)...)
				require.NoError(t, json.Unmarshal([]byte(out), &res), out)
				return res.TaskID
			}
			status := func(id int64) string {
				var s string
				err := db.Pool.QueryRow(ctx, `SELECT status FROM stepready.tasks WHERE id = $1`, id).Scan(&s)
				if err != nil {
					return err.Error()
				}
				return s
			}
			waitStatus := func(id int64, want string) {
				t.Helper()
				require.Eventually(t, func() bool { return status(id) == want }, time.Minute, 20*time.Millisecond,
					"task %d: want %s", id, want)
			}

			// Templates, tasks and a schedule, all made by the CLI through PgBouncer.
			dir := t.TempDir()
			cli(adminURL, "template", "apply", writeFile(t, dir, "diamond.yaml", pgbDiamond),
				writeFile(t, dir, "once.yaml", pgbOnce), writeFile(t, dir, "never.yaml", pgbNever),
				writeFile(t, dir, "tick.yaml", pgbTick), writeFile(t, dir, "later.yaml", pgbLater))
			var diamonds []int64
			for range 5 {
				diamonds = append(diamonds, createTask("pgb-diamond"))
			}
			// Bulk creation: definitions from a file, contexts for a template.
			cli(adminURL, "task", "create", "-f", writeFile(t, dir, "bulk.json", `[
				{"name": "pgb-bulk", "steps": [{"name": "s", "handler": "noop"}]},
				{"name": "pgb-bulk", "steps": [{"name": "s", "handler": "noop"}]}]`))
			cli(adminURL, "task", "create", "pgb-later", "--contexts-file",
				writeFile(t, dir, "contexts.jsonl", "{\"n\": 1}\n{\"n\": 2}\n"))
			once, never := createTask("pgb-once"), createTask("pgb-never")
			paused, cancelled := createTask("pgb-later", "--in", "1h"), createTask("pgb-later", "--in", "1h")
			cli(adminURL, "schedule", "create", "tick", "--template", "pgb-tick", "--cron", "@every 1s")

			// The daemon, as stepready_worker through PgBouncer, with a plain URL: --poll-only picks the query mode.
			// Complete tasks are kept (the CLI reads them below); cancelled (and failed) ones are pruned after a
			// second.
			stopDaemon := startBackground(t, "run", "--database-url", workerURL, "--dispatch", dispatch,
				"--poll-only", "--poll-interval", "100ms", "--worker-id", "pgb-"+dispatch, "--retention-complete", "0",
				"--retention-failed", "1s", "--prune-interval", "200ms", "--log-level", "debug")
			// The console on its own (`scheduler ui`), as stepready_operator through PgBouncer, with actions.
			uiAddr := freeAddr(t)
			stopUI := startBackground(t, "ui", "--database-url", operatorURL, "--addr", uiAddr,
				"--ui-allow-actions", "--ui-token", pgbToken)

			// Creation, retries and the DAG.
			for _, id := range diamonds {
				waitStatus(id, "complete")
			}
			require.Eventually(t, func() bool {
				var n int
				err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks WHERE status = 'complete'
					AND (name = 'pgb-bulk' OR context ? 'n')`).Scan(&n)
				return err == nil && n == 4
			}, time.Minute, 20*time.Millisecond, "the tasks created in bulk run")
			var attempts int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT sum(attempts) FROM stepready.steps
				WHERE task_id = ANY ($1) AND name = 'b'`, diamonds).Scan(&attempts))
			require.Equal(t, 3*len(diamonds), attempts, "each b failed twice, then succeeded")
			var outOfOrder int
			// By event ids, not timestamps: d's claim may run in a transaction that began (now()) before b's
			// completion committed, but its start event is inserted after that commit, so its id is higher.
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps d
				JOIN stepready.steps b ON b.task_id = d.task_id AND b.name = 'b'
				WHERE d.task_id = ANY ($1) AND d.name = 'd'
				  AND (SELECT min(e.id) FROM stepready.step_events e WHERE e.task_id = d.task_id AND e.step_id = d.id
				        AND e.event = 'attempt.started')
				    < (SELECT max(e.id) FROM stepready.step_events e WHERE e.task_id = b.task_id AND e.step_id = b.id
				        AND e.event = 'step.completed')`, diamonds).Scan(&outOfOrder))
			require.Zero(t, outOfOrder, "d starts after b completes")
			for _, id := range []int64{once, never} {
				require.Eventually(t, func() bool {
					var state string
					err := db.Pool.QueryRow(ctx, `SELECT state FROM stepready.steps WHERE task_id = $1`, id).Scan(&state)
					return err == nil && state == "waiting_for_retry"
				}, time.Minute, 20*time.Millisecond, "task %d: its step waits an hour for its retry", id)
			}

			// The schedule fires every second.
			require.Eventually(t, func() bool {
				var n int
				err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks
					WHERE idempotency_key LIKE 'schedule:tick:%' AND status = 'complete'`).Scan(&n)
				return err == nil && n >= 2
			}, time.Minute, 50*time.Millisecond, "the schedule fires and its tasks run")

			// The operator commands, as stepready_operator through PgBouncer.
			cli(operatorURL, "step", "retry", fmt.Sprintf("%d/s", once))
			waitStatus(once, "complete")
			cli(operatorURL, "step", "resolve", fmt.Sprintf("%d/s", never), "--output", `{"fixed": "by hand"}`)
			waitStatus(never, "complete")
			cli(operatorURL, "task", "pause", fmt.Sprint(paused))
			cli(operatorURL, "task", "resume", fmt.Sprint(paused))
			cli(operatorURL, "task", "cancel", fmt.Sprint(cancelled), "--reason", "behind pgbouncer")
			cli(operatorURL, "task", "reset", fmt.Sprint(cancelled))
			cli(operatorURL, "task", "cancel", fmt.Sprint(cancelled))
			var operatorEvents, byCLI int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE details ->> 'actor' = 'cli')
				FROM stepready.step_events WHERE event LIKE 'operator.%'`).Scan(&operatorEvents, &byCLI))
			require.GreaterOrEqual(t, operatorEvents, 7, "retry, resolve, pause, resume, cancel, reset, cancel")
			require.Equal(t, operatorEvents, byCLI, "every operator event of the CLI says actor cli")

			// Pruning: the cancelled task goes after a second; complete ones stay.
			require.Eventually(t, func() bool { return strings.Contains(status(cancelled), "no rows") }, time.Minute,
				50*time.Millisecond, "the cancelled task is pruned")
			require.Equal(t, "complete", status(diamonds[0]))

			// The read commands, through PgBouncer.
			for _, args := range [][]string{
				{"task", "list"},
				{"task", "list", "--status", "complete", "--output", "json"},
				{"task", "show", fmt.Sprint(diamonds[0])},
				{"task", "show", fmt.Sprint(diamonds[0]), "--output", "json"},
				{"task", "events", fmt.Sprint(diamonds[0])},
				{"explain", fmt.Sprint(paused)},
				{"explain", "--step", fmt.Sprintf("%d/s", paused), "--output", "json"},
				{"template", "list"},
				{"schedule", "list"},
				{"schedule", "preview", "tick"},
				{"policy", "list"},
				{"policy", "simulate", "standard"},
				{"flow", "list"},
			} {
				require.NotEmpty(t, cli(operatorURL, args...), "scheduler %v", args)
			}
			// Pruning is the worker role's job: its dry run checks that privilege too.
			require.NotEmpty(t, cli(workerURL, "prune", "--older-than", "1h", "--dry-run"))
			require.Contains(t, cli(operatorURL, "task", "show", fmt.Sprint(once)), "complete")

			// The console's pages, and an action (actor ui).
			base := "http://" + uiAddr
			var stepID int64
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT id FROM stepready.steps WHERE task_id = $1 AND name = 'd'`,
				diamonds[0]).Scan(&stepID))
			require.Eventually(t, func() bool {
				code, _, err := get(t, base+"/healthz")
				return err == nil && code == http.StatusOK
			}, time.Minute, 20*time.Millisecond, "the console listens")
			for _, path := range []string{"/", "/?status=complete", fmt.Sprintf("/tasks/%d", diamonds[0]),
				fmt.Sprintf("/tasks/%d/steps/%d", diamonds[0], stepID), "/templates", "/policies", "/schedules", "/flow"} {
				code, body, err := get(t, base+path)
				require.NoError(t, err, path)
				require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
			}
			code := postBearer(t, fmt.Sprintf("%s/tasks/%d/pause", base, paused), pgbToken)
			require.Equal(t, http.StatusSeeOther, code)
			var actor string
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT details ->> 'actor' FROM stepready.step_events
				WHERE task_id = $1 AND event = 'operator.pause' ORDER BY id DESC LIMIT 1`, paused).Scan(&actor))
			require.Equal(t, "ui", actor)

			// Stop; nothing in any log says a session was relied on.
			uiText, err := stopUI()
			require.NoError(t, err, uiText)
			daemonText, err := stopDaemon()
			require.NoError(t, err, daemonText)
			for name, text := range map[string]string{"daemon": daemonText, "console": uiText,
				"cli": transcript.String(), "pgbouncer": bouncer.Log()} {
				require.Empty(t, pgtest.PoolerFailures(text), "%s log", name)
			}
			require.Contains(t, daemonText, "query_exec_mode="+store.PoolerQueryExecMode.String(),
				"--poll-only picked the query mode")
		})
	}
}

// postBearer posts an empty form to url with the console token as bearer, without following the redirect, and
// returns the status code.
func postBearer(t *testing.T, url, token string) int {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(""))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

// TestCLIConnectionKeepsNothingInTheSession: the CLI's connection works through a transaction pooler. An operator
// command leaves nothing in the session: the actor was set for its transaction only (its event still says
// cli), and no named prepared statement was made (a pooler would hand the next transaction a server connection
// without it). Its connection sends no startup parameter of its own.
func TestCLIConnectionKeepsNothingInTheSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := cliSetup(t)
	task := b.createTask(`{"name": "session", "steps": [{"name": "s", "handler": "noop"}]}`)
	step := b.stepID(task, "s")
	b.exec(`UPDATE stepready.steps SET state = 'error', attempts = 1, max_attempts = 1 WHERE id = $1`, step)

	o := &dbOptions{url: b.db.URL}
	conn, err := o.connect(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, conn.Close(ctx)) }()
	require.NotContains(t, conn.Config().RuntimeParams, "stepready.actor", "no custom startup parameter")
	_, err = stepready.RetryStepNow(ctx, conn, step, cliActor)
	require.NoError(t, err)

	var actor string
	var prepared int
	require.NoError(t, conn.QueryRow(ctx, `SELECT COALESCE(current_setting('stepready.actor', true), ''),
		(SELECT count(*) FROM pg_catalog.pg_prepared_statements)`).Scan(&actor, &prepared))
	require.Empty(t, actor, "the actor is not a setting of the session")
	require.Zero(t, prepared, "no named prepared statement")
	require.Equal(t, int64(1), b.int64(`SELECT count(*) FROM stepready.step_events
		WHERE step_id = $1 AND event = 'operator.retry_now' AND details ->> 'actor' = 'cli'`, step))
}
