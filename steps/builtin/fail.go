package builtin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stepready/stepready/steps"
)

// failInput is the input of the `fail` handler.
type failInput struct {
	// Times is how many attempts fail (attempts 1..Times); ≥ 0, default 0.
	Times int `json:"times"`
	// Class is the failure class of the failing attempts; default transient.
	Class string `json:"class"`
	// Message is the error message of the failing attempts; default "fail handler: attempt A of N fails".
	Message string `json:"message"`
	// RetryAfterMS, when set, is the exact delay requested before the next attempt, in ms (≥ 0).
	RetryAfterMS *int64 `json:"retry_after_ms"`
}

// failOutput is the output of the `fail` handler once it succeeds.
type failOutput struct {
	Attempts int `json:"attempts"`
}

// decodeFailInput decodes and checks the input of the `fail` handler; a bad input is a permanent error naming
// the field.
func decodeFailInput(step *steps.Step) (failInput, error) {
	var in failInput
	if err := decodeInput(step, &in); err != nil {
		return in, err
	}
	if in.Times < 0 {
		return in, badInput(step, "times", "must be ≥ 0, got %d", in.Times)
	}
	if in.RetryAfterMS != nil && (*in.RetryAfterMS < 0 || *in.RetryAfterMS > maxSleepMS) {
		return in, badInput(step, "retry_after_ms", "must be between 0 and %d, got %d", maxSleepMS, *in.RetryAfterMS)
	}
	return in, nil
}

// handleFail is the `fail` handler: it fails the first input.times attempts, then succeeds.
func handleFail(_ context.Context, step *steps.Step) (any, error) {
	in, err := decodeFailInput(step)
	if err != nil {
		return nil, err
	}

	if step.Attempt > in.Times {
		return failOutput{Attempts: step.Attempt}, nil
	}
	msg := in.Message
	if msg == "" {
		msg = fmt.Sprintf("fail handler: attempt %d of %d fails", step.Attempt, in.Times)
	}
	class := cmp.Or(in.Class, steps.ClassTransient)
	if in.RetryAfterMS != nil {
		return nil, steps.FailAfter(class, errors.New(msg), time.Duration(*in.RetryAfterMS)*time.Millisecond)
	}
	return nil, steps.Fail(class, errors.New(msg))
}
