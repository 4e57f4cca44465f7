package steps

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// DefaultTimeout is the attempt timeout of a step that sets no timeout_ms (a daemon may choose another:
// stepready.Config.DefaultTimeout).
const DefaultTimeout = 5 * time.Minute

// MaxOutputBytesDefault is the largest output (encoded as JSON) an attempt may record by default, 1 MiB: a larger
// one fails the attempt as contract_failure naming the size (stepready.Config.MaxOutputBytes).
const MaxOutputBytesDefault = 1 << 20

// ErrShutdown is the cancellation cause (context.Cause) of a handler's context when the daemon stops before the
// attempt finished: the attempt is then handed back uncharged instead of being recorded as failed. A handler may
// test for it to tell a shutdown from its timeout.
var ErrShutdown = errors.New("stepready: daemon shutting down")

// Step is what a handler receives for one attempt of one step.
type Step struct {
	// ID is the step's id (stepready.steps.id).
	ID int64
	// TaskID is the id of the task the step belongs to.
	TaskID int64
	// Name is the step's name, unique within its task.
	Name string
	// Handler is the registered handler name the step asked for.
	Handler string
	// Input is the step's JSON input for this iteration (the definition's input, or the next input chosen by the
	// previous iteration of a repeating step), with its references (`${deps.NAME.PATH}`, `${context.PATH}`,
	// `${task.id}`: SPEC §18, docs/dataflow.md) resolved by the database when the attempt started.
	Input json.RawMessage
	// Context is the task's JSON context.
	Context json.RawMessage
	// Deps is a JSON object with one member per direct parent that is complete or resolved_manually, named by
	// the parent's step name, whose value is that parent's output (a skipped parent has none; `{}` for a step
	// without such parents). Read one member with Dep.
	Deps json.RawMessage
	// Element is the array item a map step's element works on (SPEC §19); empty for a step that is not an
	// element.
	Element json.RawMessage
	// Index is the element's 0-based position in its map step's array, or -1 for a step that is not an element.
	Index int
	// Attempt is the 1-based number of this attempt within the current iteration (what rules see as `attempt`,
	// and events and logs record). It starts again at 1 after the step is reset or repeats, so it does not
	// identify a run: the executor fences every write of the attempt with the step's fencing token instead
	// (docs/functions.md, "The fencing token").
	Attempt int
	// Iteration is the 0-based iteration of a repeating (polling, paginating) step.
	Iteration int
	// Queue is the step's queue.
	Queue string
	// Timeout is the per-attempt timeout the step defines (zero: the daemon's default). The handler's context
	// carries the resulting deadline.
	Timeout time.Duration
	// Rules is the step's outcome rules document (SPEC §8; empty when it has none). The executor evaluates it
	// after the attempt; handlers need not look at it.
	Rules json.RawMessage
}

// DecodeInput unmarshals the step's input into v. A failure is returned as a permanent error: input that does
// not decode will not decode on the next attempt either.
func (s *Step) DecodeInput(v any) error {
	if len(s.Input) == 0 {
		return nil
	}
	if err := json.Unmarshal(s.Input, v); err != nil {
		return Permanent(&InputError{Step: s.Name, Err: err})
	}
	return nil
}

// Dep unmarshals the output of the direct parent named name (from Deps) into v. It returns a *DepError wrapped
// as a permanent failure when the step has no such member (the parent is not a direct parent, or was skipped)
// or when the output does not decode into v: neither changes on the next attempt.
func (s *Step) Dep(name string, v any) error {
	var deps map[string]json.RawMessage
	if len(s.Deps) > 0 {
		if err := json.Unmarshal(s.Deps, &deps); err != nil {
			return Permanent(&DepError{Step: s.Name, Dep: name, Err: err})
		}
	}
	raw, ok := deps[name]
	if !ok {
		return Permanent(&DepError{Step: s.Name, Dep: name, Err: ErrNoDep})
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return Permanent(&DepError{Step: s.Name, Dep: name, Err: err})
	}
	return nil
}

// ErrNoDep is the cause of a DepError whose parent has no member in deps: it is not a direct parent of the
// step, or it was skipped.
var ErrNoDep = errors.New("no such member in deps (not a direct parent, or skipped)")

// DepError reports a parent's output that Step.Dep cannot give.
type DepError struct {
	// Step is the step's name.
	Step string
	// Dep is the parent's name that was asked for.
	Dep string
	// Err is the cause: ErrNoDep, or the decoding error.
	Err error
}

// Error implements error.
func (e *DepError) Error() string {
	return "step " + e.Step + ": deps." + e.Dep + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *DepError) Unwrap() error { return e.Err }

// InputError reports a step input that does not decode into what the handler expects.
type InputError struct {
	// Step is the step's name.
	Step string
	// Err is the decoding error.
	Err error
}

// Error implements error.
func (e *InputError) Error() string { return "step " + e.Step + ": bad input: " + e.Err.Error() }

// Unwrap returns the decoding error.
func (e *InputError) Unwrap() error { return e.Err }

// Handler runs one attempt of a step.
//
// Return (output, nil) to complete the step; output is encoded as JSON (a json.RawMessage is used as is, nil
// becomes JSON null). Return an error to fail the attempt: a plain error is a `transient` failure, retried under
// the step's retry policy; wrap it with Fail, FailAfter or Permanent to choose the failure class or the delay.
// Return Repeat(…) to finish this iteration successfully and run the step again (polling, pagination).
// Whatever the handler returns, a step with outcome rules (SPEC §8) has them evaluated on the outcome before
// anything is recorded, panics and abandoned attempts included; rules that do not compile fail the attempt
// before the handler is called.
//
// The context is cancelled at the step's timeout (the failure is then of class `timeout`) and when the daemon
// shuts down (the attempt is then handed back uncharged). A handler must return promptly once its context is
// done; one that does not is abandoned and its attempt recorded as a `timeout` failure. A panic is recovered
// and recorded as a `permanent` failure with its stack.
type Handler interface {
	Handle(ctx context.Context, step *Step) (output any, err error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, step *Step) (any, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, step *Step) (any, error) { return f(ctx, step) }

// OutputWithHTTPStatus is an optional interface of a handler's output. An output that came from an HTTP
// response implements it to report the response's status, which the outcome rules of a successful attempt see
// as `outcome.http.status` (SPEC §8); without it a successful attempt has `outcome.http.status == 0`. A failed
// attempt reports its status through Error.HTTPStatus instead. The `http` built-in's output implements it, so a
// rule can tell a 202 Accepted from a 200 OK. The output is still encoded as JSON for the database and
// `outcome.result` as usual; the method only adds the status beside it.
type OutputWithHTTPStatus interface {
	// HTTPStatus returns the status code of the response the output was made from.
	HTTPStatus() int
}
