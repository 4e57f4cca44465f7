package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
)

// Issue 25, RELIABILITY promise 6: nothing a client can write stops other tasks.

// logRecords is a slog handler that keeps every record at warn level or above (and forwards to testLogger's).
type logRecords struct {
	mu      sync.Mutex
	records []slog.Record
	next    slog.Handler
}

func newLogRecords(t *testing.T) *logRecords { return &logRecords{next: testLogger(t).Handler()} }

func (l *logRecords) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= slog.LevelWarn || l.next.Enabled(ctx, level)
}

func (l *logRecords) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		l.mu.Lock()
		l.records = append(l.records, r.Clone())
		l.mu.Unlock()
	}
	if l.next.Enabled(ctx, r.Level) {
		return l.next.Handle(ctx, r)
	}
	return nil
}

func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l } // attributes are not needed here
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// count returns how many records at level or above had each message.
func (l *logRecords) count(level slog.Level) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[string]int{}
	for _, r := range l.records {
		if r.Level >= level {
			n[r.Message]++
		}
	}
	return n
}

// Rows written around the tables' bounds (the CHECK constraints dropped, as a superuser's write or a restored dump
// could leave them) next to healthy tasks: the healthy tasks complete in both dispatch modes, each bad row ends
// failed alone (or, with a due time of 'infinity', simply never due; with a queue no daemon can work, never
// claimed: a daemon claims its own queues only), and no claim fails.
func TestARowWrittenAroundTheBoundsFailsAlone(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			_, err := b.db.Pool.Exec(ctx, `ALTER TABLE stepready.steps
				DROP CONSTRAINT IF EXISTS steps_queue_is_a_river_queue_name,
				DROP CONSTRAINT IF EXISTS steps_timeout_ms_fits_a_go_duration,
				DROP CONSTRAINT IF EXISTS steps_next_attempt_at_is_finite,
				DROP CONSTRAINT IF EXISTS steps_rate_period_ms_fits_a_go_duration`)
			require.NoError(t, err)
			bad := func(name, set string) int64 {
				t.Helper()
				id := b.createTask(t, fmt.Sprintf(`{"name": %q, "steps": [{"name": %[1]q, "handler": "noop"}]}`, name))
				_, err := b.db.Pool.Exec(ctx, `UPDATE stepready.steps SET `+set+` WHERE task_id = $1`, id)
				require.NoError(t, err)
				return id
			}
			queueTask := bad("queue", `queue = 'Bad Queue!'`)
			timeoutTask := bad("timeout", `timeout_ms = 1e16`)
			neverTask := bad("never", `next_attempt_at = 'infinity'`)
			periodTask := bad("period", `rate_key = 'api', rate_limit = 1, rate_period_ms = 1e16`)
			healthy := make([]int64, 20)
			for i := range healthy {
				healthy[i] = b.createTask(t, fmt.Sprintf(`{"name": "ok%d", "steps": [{"name": "a", "handler": "noop"},
					{"name": "b", "handler": "noop", "depends_on": ["a"]}]}`, i))
			}

			logs := newLogRecords(t)
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: 200 * time.Millisecond,
				Logger: slog.New(logs)})
			for _, id := range healthy {
				b.waitTask(t, id, 30*time.Second, "complete")
			}
			// The token bucket of a period beyond any Go duration is clamped, not overflowed: its one token is
			// there at once.
			b.waitTask(t, periodTask, 30*time.Second, "complete")
			for task, want := range map[int64]string{
				timeoutTask: `step "timeout" cannot be dispatched: timeout_ms: must be between 1 and 9223372036854 ms`,
			} {
				b.waitTask(t, task, 30*time.Second, "error")
				var class, message string
				var attempts int
				require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT last_error ->> 'class', last_error ->> 'message',
					attempts FROM stepready.steps WHERE task_id = $1`, task).Scan(&class, &message, &attempts))
				require.Equal(t, "deterministic", class)
				require.Contains(t, message, want)
				require.Equal(t, 1, attempts, "failed once, never retried")
			}
			var neverState string
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT state FROM stepready.steps WHERE task_id = $1`, neverTask).
				Scan(&neverState))
			require.Equal(t, "pending", neverState, "a step due at 'infinity' is never due, and stops nothing")
			// No daemon works a queue River refuses (Config.Queues takes queue names only), so that row is never
			// claimed; the guard behind it (the row check, River's refusal) is TestRiverDispatchFailsAloneAStepItCannotDispatch's.
			var queueState string
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT state FROM stepready.steps WHERE task_id = $1`, queueTask).
				Scan(&queueState))
			require.Equal(t, "pending", queueState, "a step of a queue no daemon works is never claimed")

			errs := logs.count(slog.LevelError)
			require.Zero(t, errs["readiness: claim"], "no claim failed: %v", errs)
			require.Zero(t, errs["readiness: next claim time"], "%v", errs)
		})
	}
}
