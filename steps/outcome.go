package steps

import (
	"errors"
	"fmt"
	"time"
)

// Failure classes seeded in stepready.failure_classes. The table is data: a handler may use any class name, and
// an unknown class is treated as transient.
const (
	ClassTransient       = "transient"
	ClassTimeout         = "timeout"
	ClassStalled         = "stalled"
	ClassRateLimited     = "rate_limited"
	ClassContractFailure = "contract_failure"
	ClassTestFailure     = "test_failure"
	ClassDeterministic   = "deterministic"
	ClassPermanent       = "permanent"
	ClassBudgetExhausted = "budget_exhausted"
	ClassCanceled        = "canceled"
)

// Error is a classified failure of an attempt. Handlers build it with Fail, FailAfter or Permanent, or fill it
// directly to add a code or HTTP status. Its fields become the error document recorded by stepready.fail_step.
type Error struct {
	// Class is the failure class (a row of stepready.failure_classes, or any name: unknown means transient).
	// Empty means transient.
	Class string
	// Code is an optional machine-readable code (an HTTP status text, a SQLSTATE, an exit code).
	Code string
	// HTTPStatus is the HTTP status of the failed call, when there was one.
	HTTPStatus int
	// RetryAfter, when set, is the exact delay before the next attempt (a server's Retry-After, say). It is used
	// as is: no backoff, no jitter, no cap. It must not be negative (docs/retry.md): a negative delay is bad input, and
	// the attempt is recorded as a `contract_failure` whose message names the value and keeps Class and Err.
	RetryAfter *time.Duration
	// NotRetryable forces the failure to be final whatever the class says.
	NotRetryable bool
	// Err is the underlying error; its message is recorded.
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	msg := "<nil>"
	if e.Err != nil {
		msg = e.Err.Error()
	}
	return e.class() + ": " + msg
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

func (e *Error) class() string {
	if e.Class == "" {
		return ClassTransient
	}
	return e.Class
}

// Fail classifies err as a failure of the given class.
func Fail(class string, err error) error { return &Error{Class: class, Err: err} }

// FailAfter classifies err and asks for the next attempt exactly after d (for example a server's Retry-After).
// d must be >= 0: a negative d is recorded as a `contract_failure` naming d, with class and err in its message.
func FailAfter(class string, err error, d time.Duration) error {
	return &Error{Class: class, Err: err, RetryAfter: &d}
}

// Permanent marks err as a permanent failure: the step is not retried.
func Permanent(err error) error { return &Error{Class: ClassPermanent, Err: err} }

// RepeatRequest is returned (as an error value) by Repeat: the attempt succeeded with Output and the step runs
// again after Delay with NextInput (nil keeps the current input). It is control flow, not a failure. A step with
// outcome rules evaluates them first, on an ok outcome whose result is Output: a matching rule decides instead
// (break, fail, …), and the repetition applies when none matches.
type RepeatRequest struct {
	// Output is this iteration's output, collected per the step's collect mode.
	Output any
	// NextInput is the next iteration's input; nil keeps the current one.
	NextInput any
	// Delay is how long to wait before the next iteration. It must not be negative: a negative delay is bad input,
	// recorded as a failure of class contract_failure that names it (the iteration is not repeated).
	Delay time.Duration
}

// Error implements error so that a handler can return a RepeatRequest in its error position.
func (r *RepeatRequest) Error() string { return fmt.Sprintf("repeat after %s", r.Delay) }

// Repeat ends the iteration successfully and schedules the next one (polling, pagination).
func Repeat(output, nextInput any, delay time.Duration) error {
	return &RepeatRequest{Output: output, NextInput: nextInput, Delay: delay}
}

// AsError reports whether err carries a classified *Error, and returns it.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
