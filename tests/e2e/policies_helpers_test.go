package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/templates"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/steps/builtin"
)

// polExamplesDir is the directory of the retry-policy examples embedded in docs/policies.md.
const polExamplesDir = "../../examples/policies"

// polAPIHost is the host the HTTP examples call; polSetup routes it to a local httptest server.
const polAPIHost = "api.example.test"

// polResponse is one scripted answer of the fake API.
type polResponse struct {
	status     int
	body       string
	retryAfter func() string // the Retry-After header, computed when the response is sent; nil: none
	drop       bool          // close the connection without answering (a network error for the client)
}

// polAPI is a fake HTTP API answering from a script, one entry per request; the last entry repeats.
type polAPI struct {
	t      *testing.T
	srv    *httptest.Server
	mu     sync.Mutex
	script []polResponse
	calls  int
	sent   []string // the Retry-After value sent with each response ("" when none)
}

func (a *polAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	i := min(a.calls, len(a.script)-1)
	a.calls++
	resp := a.script[i]
	ra := ""
	if resp.retryAfter != nil {
		ra = resp.retryAfter()
	}
	a.sent = append(a.sent, ra)
	a.mu.Unlock()

	if r.Host != polAPIHost {
		http.Error(w, "unexpected host "+r.Host, http.StatusMisdirectedRequest)
		return
	}
	if resp.drop {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			a.t.Errorf("fake API: hijack: %v", err)
			return
		}
		_ = conn.Close()
		return
	}
	if ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.status)
	_, _ = w.Write([]byte(resp.body))
}

// requests returns how many requests the API received and the Retry-After values it sent.
func (a *polAPI) requests() (int, []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls, append([]string(nil), a.sent...)
}

// polNewAPI starts a fake API answering with script.
func polNewAPI(t *testing.T, script ...polResponse) *polAPI {
	t.Helper()
	require.NotEmpty(t, script)
	a := &polAPI{t: t, script: script}
	a.srv = httptest.NewServer(a)
	t.Cleanup(a.srv.Close)
	return a
}

// client returns an HTTP client that sends every request for polAPIHost to the fake API and refuses any other
// host, so the examples run verbatim with their http://api.example.test URLs. Keep-alives are off: a dropped
// connection is then never retried silently by the transport on a reused connection.
func (a *polAPI) client() *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil || host != polAPIHost {
				return nil, fmt.Errorf("test transport: no route to %s", addr)
			}
			return dialer.DialContext(ctx, network, a.srv.Listener.Addr().String())
		},
	}}
}

// polSetup is setup with the built-in handlers registered (http through api's client when api is not nil, sql
// on a pool of its own whose role has no stepready rights, as `scheduler run --sql-database-url` gives it) plus
// extra, and a direct-dispatch daemon started. The one-minute poll interval means a
// retry that starts on time was woken by the due timer.
func polSetup(t *testing.T, mode string, api *polAPI, extra map[string]steps.Handler) *bundle {
	t.Helper()
	b := setup(t)
	b.reg = steps.NewRegistry()
	sqlPool, err := pgxpool.New(context.Background(), b.db.LoginRole(t, ""))
	require.NoError(t, err)
	t.Cleanup(sqlPool.Close)
	opts := builtin.Options{Pool: sqlPool}
	if api != nil {
		opts.HTTPClient = api.client()
	}
	require.NoError(t, builtin.Register(b.reg, opts))
	for name, h := range extra {
		require.NoError(t, b.reg.Register(name, h))
	}
	b.start(t, stepready.Config{Dispatch: mode, PollInterval: time.Minute, ReapInterval: time.Second})
	return b
}

// polCreate creates a task from examples/policies/<file>, read as `scheduler task create -f` reads it and
// created through the library entry point.
func (b *bundle) polCreate(t *testing.T, file string) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(polExamplesDir, file))
	require.NoError(t, err)
	def, err := templates.ParseDefinition(file, data)
	require.NoError(t, err)
	id, err := stepready.CreateTask(context.Background(), b.db.Pool, def)
	require.NoError(t, err)
	return id
}

// polScript returns a handler failing attempt n with script[n-1] (nil: succeed) and succeeding after the script.
func polScript(script ...error) steps.Handler {
	return steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
		if s.Attempt <= len(script) && script[s.Attempt-1] != nil {
			return nil, script[s.Attempt-1]
		}
		return map[string]int{"attempt": s.Attempt}, nil
	})
}

// polStepRow is the final state of a step.
type polStepRow struct {
	ID        int64
	State     string
	Attempts  int
	LastError map[string]any
	Output    json.RawMessage
}

func (b *bundle) polStep(t *testing.T, taskID int64, name string) polStepRow {
	t.Helper()
	var r polStepRow
	var lastErr []byte
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
		SELECT id, state, attempts, last_error, output FROM stepready.steps WHERE task_id = $1 AND name = $2`,
		taskID, name).Scan(&r.ID, &r.State, &r.Attempts, &lastErr, &r.Output))
	if lastErr != nil {
		require.NoError(t, json.Unmarshal(lastErr, &r.LastError))
	}
	return r
}

// polRetry is one retry.scheduled event with the start of the attempt it scheduled.
type polRetry struct {
	Attempt  int
	FailedAt time.Time // the failure's database time (p_as_of of fail_step)
	Next     time.Time // next_attempt_at
	DelayMS  int64     // details.delay_ms
	Details  map[string]any
	Started  *time.Time // attempt.started of attempt+1, nil when it never started
}

// polRetries returns the retry.scheduled events of a step, in order.
func (b *bundle) polRetries(t *testing.T, stepID int64) []polRetry {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `
		SELECT f.attempt, f.at, (f.details ->> 'next_attempt_at')::timestamptz, (f.details ->> 'delay_ms')::bigint,
		       f.details,
		       (SELECT min(s.at) FROM stepready.step_events s
		         WHERE s.step_id = f.step_id AND s.event = 'attempt.started' AND s.attempt = f.attempt + 1)
		  FROM stepready.step_events f
		 WHERE f.step_id = $1 AND f.event = 'retry.scheduled'
		 ORDER BY f.id`, stepID)
	require.NoError(t, err)
	defer rows.Close()
	var out []polRetry
	for rows.Next() {
		var r polRetry
		var details []byte
		require.NoError(t, rows.Scan(&r.Attempt, &r.FailedAt, &r.Next, &r.DelayMS, &details, &r.Started))
		require.NoError(t, json.Unmarshal(details, &r.Details))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// polRequireSchedule asserts that a step's retries were scheduled exactly want[i] ms after failure i+1
// (database time) and that no attempt started before its next_attempt_at.
func (b *bundle) polRequireSchedule(t *testing.T, stepID int64, want ...int64) []polRetry {
	t.Helper()
	got := b.polRetries(t, stepID)
	require.Len(t, got, len(want), "retry.scheduled events")
	for i, r := range got {
		require.Equal(t, i+1, r.Attempt)
		require.Equal(t, want[i], r.DelayMS, "attempt %d: delay", r.Attempt)
		require.Equal(t, r.FailedAt.Add(time.Duration(want[i])*time.Millisecond), r.Next,
			"attempt %d: next_attempt_at = failure time + %d ms", r.Attempt, want[i])
		require.NotNil(t, r.Started, "attempt %d never started", r.Attempt+1)
		require.False(t, r.Started.Before(r.Next), "attempt %d started at %s, before %s", r.Attempt+1, r.Started, r.Next)
	}
	return got
}

// polEventDetails returns the details of a step's events of one kind, in order.
func (b *bundle) polEventDetails(t *testing.T, stepID int64, event string) []map[string]any {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `
		SELECT details FROM stepready.step_events WHERE step_id = $1 AND event = $2 ORDER BY id`, stepID, event)
	require.NoError(t, err)
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		var raw []byte
		require.NoError(t, rows.Scan(&raw))
		var d map[string]any
		require.NoError(t, json.Unmarshal(raw, &d))
		out = append(out, d)
	}
	require.NoError(t, rows.Err())
	return out
}

// polRuleIndexes returns the rule_index of each policy.evaluated event of a step (-1: no rule matched).
func (b *bundle) polRuleIndexes(t *testing.T, stepID int64) []int {
	t.Helper()
	var out []int
	for _, d := range b.polEventDetails(t, stepID, "policy.evaluated") {
		out = append(out, int(d["rule_index"].(float64)))
	}
	return out
}
