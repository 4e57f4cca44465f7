package builtin

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/stepready/stepready/steps"
)

// sleepInput is the input of the `sleep` handler.
type sleepInput struct {
	// MS is how long to sleep, in milliseconds. Required, ≥ 0.
	MS *int64 `json:"ms"`
}

// sleepOutput is the output of the `sleep` handler.
type sleepOutput struct {
	SleptMS int64 `json:"slept_ms"`
}

// maxSleepMS is the longest sleep a time.Duration can express, in milliseconds.
const maxSleepMS = math.MaxInt64 / int64(time.Millisecond)

// decodeSleepInput decodes and checks the input of the `sleep` handler; a bad input is a permanent error naming
// the field.
func decodeSleepInput(step *steps.Step) (sleepInput, error) {
	var in sleepInput
	if err := decodeInput(step, &in); err != nil {
		return in, err
	}
	switch {
	case in.MS == nil:
		return in, badInput(step, "ms", "required (milliseconds to sleep, ≥ 0)")
	case *in.MS < 0:
		return in, badInput(step, "ms", "must be ≥ 0, got %d", *in.MS)
	case *in.MS > maxSleepMS:
		return in, badInput(step, "ms", "must be ≤ %d, got %d", maxSleepMS, *in.MS)
	}
	return in, nil
}

// handleSleep is the `sleep` handler: it waits input.ms milliseconds, or until its context is done.
func handleSleep(ctx context.Context, step *steps.Step) (any, error) {
	in, err := decodeSleepInput(step)
	if err != nil {
		return nil, err
	}

	timer := time.NewTimer(time.Duration(*in.MS) * time.Millisecond)
	defer timer.Stop()
	select {
	case <-timer.C:
		return sleepOutput{SleptMS: *in.MS}, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("sleep handler: interrupted before %d ms: %w", *in.MS, ctx.Err())
	}
}
