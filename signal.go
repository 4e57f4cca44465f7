package stepready

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stepready/stepready/internal/store"
)

// Signals (SPEC §20, docs/signals.md) as library calls: `scheduler signal send` and the console's form and
// `POST /api/signals` are thin faces over SendSignal and SendSignalToKey.

// ErrSignalRefused is what errors.Is finds in the error of a signal nobody would read: its task is finished
// (complete, error or cancelled), or no step of it that is not finished waits for that name, or every such step
// has a signal of that name buffered already (SQLSTATE 55000). The error's message says which. Nothing was
// stored.
var ErrSignalRefused = errors.New("stepready: signal refused")

// ErrInvalidSignal is what errors.Is finds in the error of a signal whose arguments are wrong: an empty or
// too long name, a payload that is not JSON or is larger than the database's max_output_bytes (a payload becomes
// a step's output), an empty idempotency key (SQLSTATE 22023, 54000). Nothing was stored.
var ErrInvalidSignal = errors.New("stepready: invalid signal")

// SignalOptions are the options of SendSignal and SendSignalToKey.
type SignalOptions struct {
	// IdempotencyKey, when not empty, makes the call idempotent per task: a second signal with the same key to
	// the same task returns the first signal's id and stores nothing (a retried webhook).
	IdempotencyKey string
	// Actor names who sends, recorded as details.actor of the task's signal.received event ("cli", "ui", "api",
	// a user's name…; default ActorDefault), as OperatorOptions.Actor is for operator events.
	Actor string
}

// SendSignal sends signal name with payload (nil or empty: {}) to task taskID (send_signal) and returns the
// signal's id. When a step of the task waits for name, the oldest such step completes now with payload as its
// output; otherwise the signal is buffered for the first step that starts waiting for it. Errors: ErrNotFound
// (no such task), ErrSignalRefused (nobody would read it), ErrInvalidSignal (bad arguments).
func SendSignal(ctx context.Context, db Beginner, taskID int64, name string, payload json.RawMessage,
	opts SignalOptions) (int64, error) {
	return sendSignal(ctx, db, name, payload, opts, taskID, func(actor string, p json.RawMessage, key *string) (int64, error) {
		return store.SendSignal(ctx, db, actor, taskID, name, p, key)
	})
}

// SendSignalToKey is SendSignal to the task whose idempotency key is taskKey (send_signal_to_key); ErrNotFound
// when no task has it.
func SendSignalToKey(ctx context.Context, db Beginner, taskKey, name string, payload json.RawMessage,
	opts SignalOptions) (int64, error) {
	return sendSignal(ctx, db, name, payload, opts, 0, func(actor string, p json.RawMessage, key *string) (int64, error) {
		return store.SendSignalToKey(ctx, db, actor, taskKey, name, p, key)
	})
}

// sendSignal sends with one statement (the actor named in it): on a pool or a connection it is the whole
// transaction, one round trip, after which the daemons are woken (wakeAfter); in the caller's transaction it is
// part of it (the actor then stays named until that transaction ends, as an operator action's does).
func sendSignal(ctx context.Context, db Beginner, name string, payload json.RawMessage, opts SignalOptions,
	taskID int64, call func(actor string, payload json.RawMessage, key *string) (int64, error)) (int64, error) {
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	if !json.Valid(payload) {
		return 0, fmt.Errorf("%w: signal %q: payload: not a JSON document", ErrInvalidSignal, name)
	}
	var key *string
	if opts.IdempotencyKey != "" {
		key = &opts.IdempotencyKey
	}
	actor := opts.Actor
	if actor == "" {
		actor = ActorDefault
	}
	id, err := call(actor, payload, key)
	if err != nil {
		return 0, signalError(err)
	}
	wakeAfter(ctx, db, taskID)
	return id, nil
}

// signalError classifies an error of send_signal(_to_key) by SQLSTATE, keeping its message.
func signalError(err error) error {
	switch store.SQLState(err) {
	case "P0002":
		return kindError{err, ErrNotFound}
	case "55000":
		return kindError{err, ErrSignalRefused}
	case "22023", "54000":
		return kindError{err, ErrInvalidSignal}
	}
	return err
}

// kindError keeps an error's message and is also kind (a sentinel).
type kindError struct {
	err  error
	kind error
}

func (e kindError) Error() string        { return e.err.Error() }
func (e kindError) Unwrap() error        { return e.err }
func (e kindError) Is(target error) bool { return target == e.kind }
