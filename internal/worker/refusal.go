package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stepready/stepready/internal/store"

	"github.com/stepready/stepready/steps"
)

// refusedForContent reports whether err is the database refusing to record an outcome for what it holds rather
// than for the state of the connection or of the database: SQLSTATE class 22 (data exception: 22P02 invalid JSON,
// 22P05 \u0000, 22003 a number beyond numeric's range, 22023 a value a function refuses such as collect = merge of
// a non-object, 2202E …) or 54 (program limit exceeded: 54000 a value too large, 54001 nesting too deep).
// Recording the same outcome again can only be refused again.
func refusedForContent(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "54"))
}

// refused records the attempt of step as failed with class contract_failure because the database refused to
// record its outcome with refusal (refusedForContent): the database's message, detail and SQLSTATE are the
// failure's message, so that last_error says why. The error document holds nothing but that message (sanitised),
// so the database accepts it.
func (e *Executor) refused(ctx context.Context, log *slog.Logger, step *attempt, refusal error) error {
	pgErr, _ := errors.AsType[*pgconn.PgError](refusal)
	msg := "the database refused to record the attempt's outcome: " + pgErr.Message
	if pgErr.Detail != "" {
		msg += " (" + pgErr.Detail + ")"
	}
	msg += " [SQLSTATE " + pgErr.Code + "]"
	log.Warn("executor: the database refused the outcome; the attempt fails as contract_failure",
		slog.String("sqlstate", pgErr.Code), slog.String("error", pgErr.Message))
	// Plain fail_step, even with a Recorder: the batch that refused the outcome has already been split.
	return e.failOn(ctx, e.Pool, log, step, errorDoc{Class: steps.ClassContractFailure, Message: msg, Code: pgErr.Code})
}

// undispatchableDoc is the failure of a step whose claim row cannot be run or dispatched: class deterministic
// (the row will not change by itself), not retryable.
func undispatchableDoc(stepName string, cause error) errorDoc {
	no := false
	return errorDoc{Class: steps.ClassDeterministic, Retryable: &no,
		Message: fmt.Sprintf("step %q cannot be dispatched: %v", stepName, cause)}
}

// FailUndispatchable records, through db (a dispatcher's claim transaction), that the claimed step c cannot be
// handed to a worker, because of cause: a value of its row the runtime cannot use (store.ClaimedStep.Check), or
// River refusing its job. Its attempt is started and failed at once with class deterministic, not retryable, and
// cause in the message; on_exhausted then applies as for any failure. The rest of the claim goes on.
func (e *Executor) FailUndispatchable(ctx context.Context, db store.DBTX, c store.ClaimedStep, cause error) error {
	d := undispatchableDoc(c.Name, cause)
	doc, err := marshalErrorDoc(d)
	if err != nil {
		return err
	}
	res, err := store.FailClaimed(ctx, db, c.StepID, e.Worker, e.Lease, doc)
	if err != nil {
		return err
	}
	log := e.stepLogger(c)
	log.Warn("executor: a claimed step cannot be dispatched; it fails", slog.Any("error", cause))
	e.failed(log, d, res)
	return nil
}
