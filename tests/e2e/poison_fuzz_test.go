package e2e

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// FuzzPlainSQLDefinitionsStopNothing writes random task definitions through the plain-SQL path (INSERTs into
// tasks, steps and step_edges in one transaction: anything the tables' triggers and constraints accept, and
// whatever they refuse) next to healthy tasks, and runs a daemon on them in both dispatch modes. Whatever was
// written, the healthy tasks complete, no claim fails, and no error is logged over and over (issue 25, RELIABILITY
// promise 6). A definition the tables refuse is refused with a data or constraint error (SQLSTATE class 22 or 23),
// never anything else.
//
// `go test` runs the seed corpus below (and testdata/fuzz/FuzzPlainSQLDefinitionsStopNothing, when the engine found
// something); the fuzz engine runs only when asked, on an otherwise idle machine (it calls a worker deadlocked
// after 10 s on one input):
//
//	go test -run '^$' -fuzz FuzzPlainSQLDefinitionsStopNothing -fuzztime 5m -parallel 2 ./tests/e2e
func FuzzPlainSQLDefinitionsStopNothing(f *testing.F) {
	// Each seed once per dispatch mode: the first byte chooses the mode.
	for _, seed := range [][]byte{
		{},
		{3, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
		[]byte("every pool's last values, then the first ones, then the middle of each pool"),
		{7, 0, 255, 254, 253, 252, 251, 250, 249, 248, 247, 246, 245, 244, 243, 242, 241, 240, 239, 238, 237, 236},
	} {
		for m := range dispatchModes {
			f.Add(append([]byte{byte(m)}, seed...))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// One dispatch mode per input, chosen by the input (the seeds cover both): the fuzz engine gives an input
		// 10 s before it calls its worker deadlocked, and a daemon run per mode takes about a second.
		g := newFuzzGen(data)
		runPlainSQLFuzz(t, dispatchModes[g.pick(len(dispatchModes))], g)
	})
}

// fuzzPools are the values the generator picks from, as SQL literals; index 0 of a pick means "column left out".
var fuzzPools = map[string][]string{
	"handler": {"'noop'", "'fails'", "'no_such_handler'", "''", "'" + strings.Repeat("h", 256) + "'",
		"'" + strings.Repeat("h", 255) + "'", "'noop '", "'NOOP'"},
	"queue": {"'default'", "'a'", "'a|b'", "'Bad Queue!'", "'" + strings.Repeat("q", 64) + "'",
		"'" + strings.Repeat("q", 65) + "'", "''", "NULL", "'a__b'", "'é'"},
	"timeout_ms":     {"1", "1000", "NULL", "0", "-1", "9223372036854", "9223372036855", "9223372036854775807"},
	"max_attempts":   {"0", "1", "3", "2147483647", "-1", "NULL"},
	"retryable":      {"true", "false", "NULL"},
	"backoff":        {"'none'", "'fixed'", "'linear'", "'exponential'", "'fib'", "NULL"},
	"base_delay_ms":  {"0", "1", "1000", "9223372036854", "9223372036855", "9223372036854775807", "-1"},
	"multiplier":     {"1", "2", "1e300", "'Infinity'", "'NaN'", "0.5", "1e308"},
	"max_delay_ms":   {"0", "1", "9223372036854", "9223372036855", "NULL", "-1"},
	"jitter":         {"0", "0.5", "1", "1.5", "'NaN'", "NULL"},
	"priority":       {"0", "2147483647", "-2147483648", "1", "NULL"},
	"breaker_limit":  {"0", "3", "2147483647", "-1", "NULL"},
	"max_iterations": {"1", "2147483647", "0", "NULL"},
	"collect":        {"'append'", "'replace'", "'merge'", "'sideways'", "NULL"},
	"on_exhausted":   {"'fail_task'", "'skip'", "'skip_cascade'", "'explode'", "NULL"},
	"next_attempt_at": {"NULL", "now()", "'-infinity'", "'infinity'", "'9999-12-31'", "'294276-12-31'",
		"'4713-01-01 BC'", "now() + interval '1 hour'", "now() - interval '100 years'"},
	"state": {"'pending'", "'waiting_for_retry'", "'complete'", "'error'", "'skipped'", "'cancelled'",
		"'resolved_manually'", "'running'", "NULL"},
	"attempts":  {"0", "1", "2", "2147483646", "2147483647", "-1"},
	"iteration": {"0", "1", "2147483646", "2147483647", "-1"},
	"input": {"'{}'", "'{\"k\": \"tenant\"}'", "'[]'", "'null'", "'\"s\"'", "'{\"k\": \"" + strings.Repeat("x", 300) + "\"}'",
		"'1e131071'"},
	"rules": {"NULL", "'[]'", "'{}'", `'[{"when": "(((", "then": {"do": "fail"}}]'`,
		`'[{"when": "outcome.status == \"ok\"", "then": {"do": "fail"}}]'`,
		`'[{"when": "1/0 == 1", "then": {"do": "retry"}}]'`, `'[{"else": {"do": "break"}}]'`},
	"concurrency": {"'k', 1", "'k', 2147483647", "'k', 0", "NULL, 1", "'k', NULL", "'${input.k}', 1",
		"'${context.t}', 1", "'" + strings.Repeat("k", 256) + "', 1", "'', 1"},
	"rate": {"'r', 1, 1", "'r', 1, 1000", "'r', 2147483647, 1", "'r', 1, 9223372036854", "'r', 1, 9223372036855",
		"'r', 1, 10000000000000000", "'r', 0, 1000", "'r', 1, 0", "'r', 1, NULL", "'${input.k}', 3, 100"},
	"task_priority": {"0", "2147483647", "-2147483648"},
	"task_paused":   {"false", "true"},
	"task_retry": {"NULL", `'{"policy": "none"}'`, `'{"max_attempts": 2147483647, "base_delay_ms": 0}'`,
		`'{"base_delay_ms": 9223372036855}'`, `'{"policy": "nope"}'`, `'{"bogus": 1}'`, `'[]'`},
	"task_context": {"'{}'", `'{"t": "acme"}'`, `'{"t": {"nested": 1}}'`, "'[]'"},
	"task_run_at":  {"NULL", "now() + interval '1 hour'", "'infinity'", "now() - interval '1 day'", "'9999-12-31'"},
}

// stepColumns are the steps columns the generator may set, in order ("concurrency" and "rate" set two and
// three columns).
var stepColumns = []string{"handler", "queue", "timeout_ms", "max_attempts", "retryable", "backoff", "base_delay_ms",
	"multiplier", "max_delay_ms", "jitter", "priority", "breaker_limit", "max_iterations", "collect", "on_exhausted",
	"next_attempt_at", "state", "attempts", "iteration", "input", "rules", "concurrency", "rate"}

// fuzzGen reads choices from the fuzz input and, past its end, from a generator seeded with the input: a short
// input (a seed) still makes whole definitions, and the fuzz engine's mutations steer the first choices.
type fuzzGen struct {
	data []byte
	i    int
	rnd  *rand.Rand
}

func newFuzzGen(data []byte) *fuzzGen {
	h := fnv.New64a()
	h.Write(data)
	return &fuzzGen{data: data, rnd: rand.New(rand.NewPCG(h.Sum64(), uint64(len(data))))}
}

func (g *fuzzGen) pick(n int) int {
	if n <= 0 {
		return 0
	}
	if g.i >= len(g.data) {
		return g.rnd.IntN(n)
	}
	b := g.data[g.i]
	g.i++
	return int(b) % n
}

// value returns a literal of pool name, or "" for "left out".
func (g *fuzzGen) value(name string) string {
	pool := fuzzPools[name]
	if k := g.pick(len(pool) + 1); k > 0 {
		return pool[k-1]
	}
	return ""
}

// fuzzTask is one generated task: its INSERT statements, run in one transaction.
func (g *fuzzGen) task(n int) []string {
	cols := []string{"name"}
	vals := []string{fmt.Sprintf("'fuzz%d'", n)}
	for _, c := range []string{"task_priority", "task_paused", "task_retry", "task_context", "task_run_at"} {
		if g.pick(3) > 0 {
			continue // most tasks set few columns, so that most are accepted and run
		}
		if v := g.value(c); v != "" {
			cols = append(cols, strings.TrimPrefix(c, "task_"))
			vals = append(vals, v)
		}
	}
	stmts := []string{fmt.Sprintf(`INSERT INTO stepready.tasks (%s) VALUES (%s)`, strings.Join(cols, ", "),
		strings.Join(vals, ", "))}
	task := fmt.Sprintf(`(SELECT id FROM stepready.tasks WHERE name = 'fuzz%d')`, n)
	nSteps := g.pick(3) + 1
	for s := range nSteps {
		cols := []string{"task_id", "name"}
		vals := []string{task, fmt.Sprintf("'s%d'", s)}
		handler := false
		// A few columns per step (most values of the pools are accepted), so that most steps are inserted and
		// run with the unusual values they hold.
		chosen := map[string]bool{}
		for range g.pick(6) {
			chosen[stepColumns[g.pick(len(stepColumns))]] = true
		}
		for _, c := range stepColumns {
			if !chosen[c] {
				continue
			}
			v := g.value(c)
			switch {
			case v == "":
				continue
			case c == "concurrency":
				cols = append(cols, "concurrency_key", "concurrency_limit")
			case c == "rate":
				cols = append(cols, "rate_key", "rate_limit", "rate_period_ms")
			default:
				cols = append(cols, c)
				handler = handler || c == "handler"
			}
			vals = append(vals, v)
		}
		if !handler {
			cols, vals = append(cols, "handler"), append(vals, "'noop'")
		}
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO stepready.steps (%s) VALUES (%s)`, strings.Join(cols, ", "),
			strings.Join(vals, ", ")))
	}
	for range g.pick(4) {
		p, c := g.pick(nSteps), g.pick(nSteps)
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
			SELECT p.id, c.id FROM stepready.steps p, stepready.steps c
			 WHERE p.task_id = %[1]s AND p.name = 's%[2]d' AND c.task_id = %[1]s AND c.name = 's%[3]d'`, task, p, c))
	}
	return stmts
}

func runPlainSQLFuzz(t *testing.T, mode string, g *fuzzGen) {
	t.Helper()
	b := setup(t)
	ctx := context.Background()
	b.reg.MustRegister("fails", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
		return nil, errors.New("fails on purpose")
	}))

	// The generated tasks: each in its own transaction, each statement under a savepoint, so that one refused
	// statement leaves the rest of the task.
	for n := range g.pick(6) + 1 {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			for _, stmt := range g.task(n) {
				sp, err := tx.Begin(ctx)
				require.NoError(t, err)
				if _, err := sp.Exec(ctx, stmt); err != nil {
					pgErr, ok := errors.AsType[*pgconn.PgError](err)
					require.True(t, ok, "%s: %v", stmt, err)
					require.True(t, strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23"),
						"a definition is refused as bad data, not with %s %q\n%s", pgErr.Code, pgErr.Message, stmt)
					require.NoError(t, sp.Rollback(ctx))
					continue
				}
				require.NoError(t, sp.Commit(ctx))
			}
			return nil
		}))
	}
	healthy := make([]int64, 6)
	for i := range healthy {
		healthy[i] = b.createTask(t, fmt.Sprintf(`{"name": "ok%d", "steps": [{"name": "a", "handler": "noop"},
			{"name": "b", "handler": "noop", "depends_on": ["a"]}]}`, i))
	}

	logs := newLogRecords(t)
	b.start(t, stepready.Config{Dispatch: mode, PollInterval: 200 * time.Millisecond, ReapInterval: time.Second,
		Logger: slog.New(logs)})
	for _, id := range healthy {
		b.waitTask(t, id, 60*time.Second, "complete")
	}
	// Let the daemon take what is left of the generated steps (at most a second: a step that fails and retries
	// at once is ready again and again, by its own policy).
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); <-time.After(20 * time.Millisecond) {
		var ready int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.step_readiness(
			ARRAY(SELECT id FROM stepready.tasks WHERE name LIKE 'fuzz%')) WHERE ready`).Scan(&ready))
		if ready == 0 {
			break
		}
	}
	// Nothing failed over and over: no claim, no recording, no error logged at all.
	require.Empty(t, logs.count(slog.LevelError), "mode %s", mode)
}
