package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/templates"
)

// The repetition examples of examples/policies (pagination in four styles and polling), loaded verbatim,
// created through stepready.CreateTask and run by the daemon against a fake API (rep_server_test.go).

// repExamplesDir is where the example task definitions live, relative to this package.
var repExamplesDir = filepath.Join("..", "..", "examples", "policies")

// repResult is how one run of an example ended.
type repResult struct {
	taskID, stepID int64
	// state, iteration, attempts, output and message are the step's columns once the task ended.
	state      string
	iteration  int
	attempts   int
	output     json.RawMessage
	class      string
	message    string
	doneReason string // details.reason of step.completed ("max_iterations"), "" otherwise
	// started holds [iteration, attempt] of every attempt.started event, in order.
	started [][2]int
}

// repRun loads the example file, creates its task with stepready.CreateTask, runs a daemon in the given
// dispatch mode whose http built-in talks to api, and waits until the task's status is want.
func repRun(t *testing.T, mode, file string, api *repAPI, want string) repResult {
	t.Helper()
	ctx := context.Background()
	b := setup(t)
	api.register(t, b.reg)
	// A one-minute poll: the iterations' delays must be honoured by the due timer, not by polling.
	b.start(t, stepready.Config{Dispatch: mode, PollInterval: time.Minute, ReapInterval: time.Second})

	data, err := os.ReadFile(filepath.Join(repExamplesDir, file))
	require.NoError(t, err)
	def, err := templates.ParseDefinition(file, data)
	require.NoError(t, err)
	taskID, err := stepready.CreateTask(ctx, b.db.Pool, def)
	require.NoError(t, err)
	require.Equal(t, want, b.waitTask(t, taskID, 30*time.Second, "complete", "error"), "task status")

	r := repResult{taskID: taskID}
	var output *string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT id, state, iteration, attempts, output::text,
		COALESCE(last_error ->> 'class', ''), COALESCE(last_error ->> 'message', ''),
		COALESCE((SELECT e.details ->> 'reason' FROM stepready.step_events e
		           WHERE e.step_id = s.id AND e.event = 'step.completed'), '')
		FROM stepready.steps s WHERE task_id = $1`, taskID).
		Scan(&r.stepID, &r.state, &r.iteration, &r.attempts, &output, &r.class, &r.message, &r.doneReason))
	if output != nil {
		r.output = json.RawMessage(*output)
	}
	rows, err := b.db.Pool.Query(ctx, `SELECT iteration, attempt FROM stepready.step_events
		WHERE step_id = $1 AND event = 'attempt.started' ORDER BY id`, r.stepID)
	require.NoError(t, err)
	for rows.Next() {
		var it, at int
		require.NoError(t, rows.Scan(&it, &at))
		r.started = append(r.started, [2]int{it, at})
	}
	require.NoError(t, rows.Err())
	repCheckDelays(t, b, r.stepID)
	return r
}

// repCheckDelays checks every iteration.continued event (logged with the iteration it starts): that iteration
// started no earlier than the next_attempt_at the event set, which is the end of the previous one plus the
// rule's delay_ms.
func repCheckDelays(t *testing.T, b *bundle, stepID int64) {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `
		SELECT c.iteration, (c.details ->> 'delay_ms')::bigint, c.at, (c.details ->> 'next_attempt_at')::timestamptz,
		       (SELECT min(s.at) FROM stepready.step_events s
		         WHERE s.step_id = c.step_id AND s.event = 'attempt.started' AND s.iteration = c.iteration)
		  FROM stepready.step_events c
		 WHERE c.step_id = $1 AND c.event = 'iteration.continued' ORDER BY c.id`, stepID)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var iteration int
		var delayMS int64
		var at, next time.Time
		var started *time.Time
		require.NoError(t, rows.Scan(&iteration, &delayMS, &at, &next, &started))
		require.Equal(t, at.Add(time.Duration(delayMS)*time.Millisecond), next, "iteration %d", iteration)
		require.NotNil(t, started, "iteration %d never started", iteration)
		require.False(t, started.Before(next), "iteration %d started at %s, before %s", iteration, *started, next)
	}
	require.NoError(t, rows.Err())
}

// repPage is one collected page: the http built-in's output.
type repPage struct {
	Status int                        `json:"status"`
	Body   map[string]json.RawMessage `json:"body"`
}

// repPages decodes an append-collected output: one http output per iteration.
func repPages(t *testing.T, output json.RawMessage) []repPage {
	t.Helper()
	var pages []repPage
	require.NoError(t, json.Unmarshal(output, &pages), "output %s", output)
	return pages
}

// repIDs returns the ids of the records under key in every page, in order.
func repIDs(t *testing.T, pages []repPage, key string) []int {
	t.Helper()
	ids := []int{}
	for i, p := range pages {
		require.Equal(t, 200, p.Status, "page %d", i)
		var records []struct {
			ID int `json:"id"`
		}
		require.NoError(t, json.Unmarshal(p.Body[key], &records), "page %d: %s", i, p.Body[key])
		for _, r := range records {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// repSeq returns 1..n.
func repSeq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// repFirstAttempts returns [i, 1] for i in 0..n-1: n iterations that each succeeded at their first attempt.
func repFirstAttempts(n int) [][2]int {
	out := make([][2]int, n)
	for i := range out {
		out[i] = [2]int{i, 1}
	}
	return out
}

// Each pagination example fetches every page once, in order, with the parameters its rule computes, and
// completes with all the records in order; each page is one iteration.
func TestRepeatPaginationExamples(t *testing.T) {
	t.Parallel()
	c100, c200 := repEncodeCursor(100), repEncodeCursor(200)
	cases := []struct {
		file    string
		records int
		key     string
		want    []string
	}{
		{"pagination-page.yaml", 250, "items", []string{
			"GET /v1/products?page=1&per_page=100",
			"GET /v1/products?page=2&per_page=100",
			"GET /v1/products?page=3&per_page=100",
		}},
		{"pagination-offset.yaml", 230, "users", []string{
			"GET /v1/users?limit=100&offset=0",
			"GET /v1/users?limit=100&offset=100",
			"GET /v1/users?limit=100&offset=200",
		}},
		// A collection that is an exact multiple of the limit costs one more, empty, page.
		{"pagination-offset.yaml", 200, "users", []string{
			"GET /v1/users?limit=100&offset=0",
			"GET /v1/users?limit=100&offset=100",
			"GET /v1/users?limit=100&offset=200",
		}},
		{"pagination-cursor.yaml", 250, "events", []string{
			"GET /v1/events?limit=100",
			"GET /v1/events?cursor=" + c100 + "&limit=100",
			"GET /v1/events?cursor=" + c200 + "&limit=100",
		}},
		{"pagination-next-url.yaml", 250, "orders", []string{
			"GET /v1/orders?status=open",
			"GET /v1/orders?status=open&page_token=" + c100,
			"GET /v1/orders?status=open&page_token=" + c200,
		}},
	}
	for _, tc := range cases {
		for _, mode := range dispatchModes {
			t.Run(fmt.Sprintf("%s/%d/%s", tc.file, tc.records, mode), func(t *testing.T) {
				t.Parallel()
				api := repNewAPI(t, repAPIConfig{records: tc.records})
				r := repRun(t, mode, tc.file, api, "complete")

				require.Equal(t, tc.want, api.Targets())
				for _, req := range api.Requests() {
					require.Equal(t, 200, req.Status, req.Target)
				}
				require.Equal(t, "complete", r.state)
				require.Equal(t, len(tc.want)-1, r.iteration, "one iteration per page, 0-based")
				require.Equal(t, repFirstAttempts(len(tc.want)), r.started)
				require.Empty(t, r.doneReason, "the rules ended the repetition, not max_iterations")
				pages := repPages(t, r.output)
				require.Len(t, pages, len(tc.want), "collect: append keeps every page")
				require.Equal(t, repSeq(tc.records), repIDs(t, pages, tc.key), "every record, in order")
			})
		}
	}
}

// The next-URL example carries its headers over to every next input: each request asked for JSON (the fake
// API answers 400 otherwise, which would fail the step).
func TestRepeatNextURLCarriesHeaders(t *testing.T) {
	t.Parallel()
	api := repNewAPI(t, repAPIConfig{records: 250})
	repRun(t, stepready.DispatchDirect, "pagination-next-url.yaml", api, "complete")
	reqs := api.Requests()
	require.Len(t, reqs, 3)
	for _, req := range reqs {
		require.Equal(t, "application/json", req.Accept, req.Target)
	}
}

// Each iteration has its own retry budget: every page fails three times with 503 and still succeeds at its
// fourth attempt (max_attempts: 4), nine failures in all; attempts restart at 1 on every page.
func TestRepeatIterationsHaveTheirOwnRetryBudget(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			api := repNewAPI(t, repAPIConfig{records: 250, failFirst: 3})
			r := repRun(t, mode, "pagination-page.yaml", api, "complete")

			var want []string
			var wantStarted [][2]int
			for page := 1; page <= 3; page++ {
				for attempt := 1; attempt <= 4; attempt++ {
					want = append(want, fmt.Sprintf("GET /v1/products?page=%d&per_page=100", page))
					wantStarted = append(wantStarted, [2]int{page - 1, attempt})
				}
			}
			require.Equal(t, want, api.Targets())
			require.Equal(t, wantStarted, r.started)
			require.Equal(t, 2, r.iteration)
			require.Equal(t, 4, r.attempts, "the last page used its whole budget")
			pages := repPages(t, r.output)
			require.Len(t, pages, 3, "failed attempts collect nothing")
			require.Equal(t, repSeq(250), repIDs(t, pages, "items"))
		})
	}
}

// Against an API that always claims there is another page, max_iterations (50 in every pagination example)
// stops the step: exactly 50 requests, and the step completes with the 50 pages collected.
func TestRepeatMaxIterationsStopsANeverEndingPaginator(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file, key string
		perPage   int
	}{
		{"pagination-page.yaml", "items", 100},
		{"pagination-offset.yaml", "users", 100},
		{"pagination-cursor.yaml", "events", 100},
		{"pagination-next-url.yaml", "orders", repOrdersPerPage},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			api := repNewAPI(t, repAPIConfig{endless: true})
			r := repRun(t, stepready.DispatchDirect, tc.file, api, "complete")

			require.Len(t, api.Targets(), 50)
			require.Equal(t, "complete", r.state)
			require.Equal(t, "max_iterations", r.doneReason)
			require.Equal(t, 49, r.iteration)
			require.Equal(t, repFirstAttempts(50), r.started)
			pages := repPages(t, r.output)
			require.Len(t, pages, 50)
			require.Equal(t, repSeq(50*tc.perPage), repIDs(t, pages, tc.key))
		})
	}
}

// The polling example polls until the export is done, keeping only the last response (collect: replace); a
// failed export fails the step at once; an export that never finishes fails it after exactly 40 polls, before
// max_iterations could complete it.
func TestRepeatPollingExample(t *testing.T) {
	t.Parallel()
	const poll = "GET /v1/exports/42"
	repeat := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = poll
		}
		return out
	}

	for _, mode := range dispatchModes {
		t.Run("done/"+mode, func(t *testing.T) {
			t.Parallel()
			api := repNewAPI(t, repAPIConfig{pollsUntilDone: 4})
			r := repRun(t, mode, "polling.yaml", api, "complete")

			require.Equal(t, repeat(4), api.Targets())
			require.Equal(t, 3, r.iteration)
			require.Equal(t, repFirstAttempts(4), r.started)
			var out struct {
				Status int `json:"status"`
				Body   struct {
					Status      string `json:"status"`
					Polls       int    `json:"polls"`
					DownloadURL string `json:"download_url"`
				} `json:"body"`
			}
			require.NoError(t, json.Unmarshal(r.output, &out), "output %s", r.output)
			require.Equal(t, 200, out.Status)
			require.Equal(t, "done", out.Body.Status)
			require.Equal(t, 4, out.Body.Polls, "collect: replace keeps the last response only")
			require.Equal(t, "http://api.example.test/v1/exports/42/file", out.Body.DownloadURL)
		})
	}

	t.Run("failed", func(t *testing.T) {
		t.Parallel()
		api := repNewAPI(t, repAPIConfig{pollsUntilDone: 2, exportOutcome: "failed"})
		r := repRun(t, stepready.DispatchDirect, "polling.yaml", api, "error")

		require.Equal(t, repeat(2), api.Targets())
		require.Equal(t, "error", r.state)
		require.Equal(t, "permanent", r.class)
		require.Equal(t, "export 42 failed", r.message)
		require.Equal(t, [][2]int{{0, 1}, {1, 1}}, r.started, "a rule's fail is final: no retry")
	})

	t.Run("never done", func(t *testing.T) {
		t.Parallel()
		api := repNewAPI(t, repAPIConfig{})
		r := repRun(t, stepready.DispatchDirect, "polling.yaml", api, "error")

		require.Equal(t, repeat(40), api.Targets())
		require.Equal(t, "error", r.state)
		require.Equal(t, "export 42 is still not done after 40 polls", r.message)
		require.Equal(t, 39, r.iteration)
		require.Empty(t, r.doneReason)
	})
}
