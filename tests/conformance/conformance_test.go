// Package conformance holds the worker conformance suite (README.md): the cases every stepready worker, in any
// language, must pass. It runs against the worker named by WORKER_CMD, or, when that is unset (go test ./...,
// make test), against this repository's reference workers: `scheduler run` in both dispatch modes and the
// Python worker (workers/python).
package conformance

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// conformanceCase is one case of the suite.
type conformanceCase struct {
	name string
	run  func(c *caseEnv)
}

// cases are the cases available now. README.md lists those pending (and the issue that brings each).
var cases = []conformanceCase{
	{"completes_with_output_recorded", caseCompletes},
	{"wakes_on_notification", caseWakesOnNotification},
	{"retries_with_backoff", caseRetriesWithBackoff},
	{"retry_after_is_exact", caseRetryAfter},
	{"permanent_failure_is_not_retried", casePermanentFailure},
	{"late_result_after_reap_is_refused", caseLateResultAfterReap},
	{"heartbeats_keep_a_long_step", caseHeartbeatsKeepALongStep},
	{"sigterm_releases_uncharged", caseSIGTERMReleasesUncharged},
	{"cancelled_attempt_ends_its_lease", caseCancelledAttemptEndsItsLease},
	{"rules", caseRules},
	{"other_queues_and_handlers_are_never_taken", caseOtherQueuesAndHandlers},
	{"deps_arrive_resolved", caseDepsArriveResolved},
	{"map_elements_arrive_resolved", caseMapElementsArriveResolved},
}

// TestConformance runs every case against every worker under test, each case with a database and a worker
// process of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, spec := range workersUnderTest(t) {
		t.Run(spec.name, func(t *testing.T) {
			t.Parallel()
			for _, cc := range cases {
				t.Run(cc.name, func(t *testing.T) {
					t.Parallel()
					cc.run(newCaseEnv(t, spec, cc.name))
				})
			}
		})
	}
}

// caseEnv is what a case works with: its database (the owner's pool, for fixtures and checks) and the worker's
// environment.
type caseEnv struct {
	t    *testing.T
	spec workerSpec
	db   *pgtest.DB
	pool *pgxpool.Pool
	env  map[string]string
}

// Worker settings of every case unless it says otherwise (README.md, "The worker's environment").
const (
	leaseDefault = "1s"
	pollInterval = "30s" // LISTEN and the retry timer must do the work; a poll would come too late
)

func newCaseEnv(t *testing.T, spec workerSpec, name string) *caseEnv {
	db := pgtest.New(t)
	// The worker connects as a login role that has stepready_worker's rights and no others (SPEC §17).
	url := db.LoginRole(t, "stepready_worker")
	return &caseEnv{t: t, spec: spec, db: db, pool: db.Pool, env: map[string]string{
		"STEPREADY_DATABASE_URL":   url,
		"STEPREADY_WORKER_ID":      "conformance-" + strings.ReplaceAll(name, "_", "-"),
		"STEPREADY_LEASE":          leaseDefault,
		"STEPREADY_REAP_INTERVAL":  "250ms",
		"STEPREADY_POLL_INTERVAL":  pollInterval,
		"STEPREADY_SHUTDOWN_GRACE": "100ms", // not 0s: scheduler run reads --shutdown-grace 0 as its default, 10 s
		"STEPREADY_CONCURRENCY":    "4",
	}}
}

// start starts the worker with the case's environment, changed by overrides.
func (c *caseEnv) start(overrides map[string]string) *workerProcess {
	env := map[string]string{}
	for k, v := range c.env {
		env[k] = v
	}
	for k, v := range overrides {
		env[k] = v
	}
	return startWorker(c.t, c.spec, env)
}

// createTask creates a task from a definition (SPEC §10) and returns its id.
func (c *caseEnv) createTask(def map[string]any) int64 {
	c.t.Helper()
	doc, err := json.Marshal(def)
	require.NoError(c.t, err)
	var id int64
	require.NoError(c.t, c.pool.QueryRow(context.Background(), `SELECT stepready.create_task($1::jsonb)`, doc).Scan(&id))
	return id
}

// stepState is a step row as the cases check it.
type stepState struct {
	ID             int64
	State          string
	Attempts       int
	Token          int
	Output         json.RawMessage
	LastError      map[string]any
	LeaseOwner     *string
	LeaseExpiresAt *time.Time
	LeaseExpired   bool // lease_expires_at < now()
}

func (c *caseEnv) step(taskID int64, name string) stepState {
	c.t.Helper()
	var s stepState
	var lastError []byte
	require.NoError(c.t, c.pool.QueryRow(context.Background(), `
		SELECT id, state, attempts, fence_token, output, last_error, lease_owner, lease_expires_at,
		       coalesce(lease_expires_at < now(), false)
		  FROM stepready.steps WHERE task_id = $1 AND name = $2`, taskID, name).
		Scan(&s.ID, &s.State, &s.Attempts, &s.Token, &s.Output, &lastError, &s.LeaseOwner, &s.LeaseExpiresAt,
			&s.LeaseExpired))
	if lastError != nil {
		require.NoError(c.t, json.Unmarshal(lastError, &s.LastError))
	}
	return s
}

// waitStep polls until the step is in one of states and returns it, failing after timeout.
func (c *caseEnv) waitStep(taskID int64, name string, timeout time.Duration, states ...string) stepState {
	c.t.Helper()
	var s stepState
	c.waitFor("step "+name+" in "+strings.Join(states, " or "), timeout, func() bool {
		s = c.step(taskID, name)
		for _, st := range states {
			if s.State == st {
				return true
			}
		}
		return false
	})
	return s
}

// waitFor polls cond every 20 ms until it holds, failing the case after timeout.
func (c *caseEnv) waitFor(what string, timeout time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not within %s", what, timeout)
		}
		<-time.After(20 * time.Millisecond)
	}
}

// event is a row of step_events.
type event struct {
	Event   string
	Attempt *int
	At      time.Time
	Details map[string]any
}

func (c *caseEnv) events(stepID int64) []event {
	c.t.Helper()
	rows, err := c.pool.Query(context.Background(),
		`SELECT event, attempt, at, details FROM stepready.step_events WHERE step_id = $1 ORDER BY id`, stepID)
	require.NoError(c.t, err)
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (event, error) {
		var e event
		var details []byte
		if err := r.Scan(&e.Event, &e.Attempt, &e.At, &details); err != nil {
			return e, err
		}
		return e, json.Unmarshal(details, &e.Details)
	})
	require.NoError(c.t, err)
	return evs
}

// eventsNamed returns the events of the step with that name, in order.
func (c *caseEnv) eventsNamed(stepID int64, name string) []event {
	var out []event
	for _, e := range c.events(stepID) {
		if e.Event == name {
			out = append(out, e)
		}
	}
	return out
}

// exec runs one statement as the database's owner (an operator or a second worker in a case).
func (c *caseEnv) exec(sql string, args ...any) {
	c.t.Helper()
	_, err := c.pool.Exec(context.Background(), sql, args...)
	require.NoError(c.t, err)
}
