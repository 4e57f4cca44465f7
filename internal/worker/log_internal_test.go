package worker

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/store"
)

func TestAttemptLoggerAddsTheAttemptToEachRecord(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	base := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}})).With("component", "client")
	e := &Executor{Logger: base}
	c := store.ClaimedStep{StepID: 7, TaskID: 3, Name: "fetch", Handler: "http"}

	log := e.attemptLogger(c, store.Started{Attempt: 2, Iteration: 1})
	log.Info("not enabled")
	require.Empty(t, buf.String(), "a record below the level is not formatted")
	require.False(t, log.Enabled(context.Background(), slog.LevelInfo))

	log.Warn("executor: heartbeat failed", slog.String("error", "boom"))
	require.Equal(t, `level=WARN msg="executor: heartbeat failed" component=client step_id=7 task_id=3 step=fetch `+
		`handler=http attempt=2 iteration=1 error=boom`, strings.TrimSpace(buf.String()))

	buf.Reset()
	e.stepLogger(c).With("decision", "retry").Error("before start")
	require.Equal(t, `level=ERROR msg="before start" component=client step_id=7 task_id=3 step=fetch handler=http `+
		`decision=retry`, strings.TrimSpace(buf.String()))

	buf.Reset()
	e.attemptLogger(c, store.Started{Attempt: 1}).WithGroup("g").Warn("grouped", slog.Int("n", 1))
	require.Equal(t, `level=WARN msg=grouped component=client step_id=7 task_id=3 step=fetch handler=http `+
		`attempt=1 iteration=0 g.n=1`, strings.TrimSpace(buf.String()))
}
