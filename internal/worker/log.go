package worker

import (
	"context"
	"log/slog"

	"github.com/stepready/stepready/internal/store"
)

// attemptHandler is the slog.Handler of one attempt's logger: it adds the step's identity (and, once the attempt
// has started, its number and iteration) to each record it handles. Unlike Logger.With, which formats its
// attributes when called, it does nothing until a record is emitted: the executor builds one logger per attempt,
// and most attempts log nothing at the enabled level.
type attemptHandler struct {
	inner     slog.Handler
	c         store.ClaimedStep
	started   bool
	attempt   int
	iteration int
}

func (h *attemptHandler) attrs() []slog.Attr {
	as := make([]slog.Attr, 0, 6)
	as = append(as, slog.Int64("step_id", h.c.StepID), slog.Int64("task_id", h.c.TaskID),
		slog.String("step", h.c.Name), slog.String("handler", h.c.Handler))
	if h.started {
		as = append(as, slog.Int("attempt", h.attempt), slog.Int("iteration", h.iteration))
	}
	return as
}

// Enabled implements slog.Handler.
func (h *attemptHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

// Handle implements slog.Handler.
func (h *attemptHandler) Handle(ctx context.Context, r slog.Record) error {
	// The record's own attributes come after the attempt's, as they would after Logger.With.
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(h.attrs()...)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(a)
		return true
	})
	return h.inner.Handle(ctx, out)
}

// WithAttrs implements slog.Handler: the result formats the attempt's attributes at once, like Logger.With.
func (h *attemptHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return h.inner.WithAttrs(append(h.attrs(), as...))
}

// WithGroup implements slog.Handler.
func (h *attemptHandler) WithGroup(name string) slog.Handler {
	return h.inner.WithAttrs(h.attrs()).WithGroup(name)
}

// stepLogger returns the logger of a claimed step (attempt not started yet).
func (e *Executor) stepLogger(c store.ClaimedStep) *slog.Logger {
	return slog.New(&attemptHandler{inner: e.logger().Handler(), c: c})
}

// attemptLogger returns the logger of a started attempt.
func (e *Executor) attemptLogger(c store.ClaimedStep, st store.Started) *slog.Logger {
	return slog.New(&attemptHandler{inner: e.logger().Handler(), c: c, started: true, attempt: st.Attempt,
		iteration: st.Iteration})
}
