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

// handleSleep is the `sleep` handler: it waits input.ms milliseconds, or until its context is done.
func handleSleep(ctx context.Context, step *steps.Step) (any, error) {
	var in sleepInput
	if err := decodeInput(step, &in); err != nil {
		return nil, err
	}
	switch {
	case in.MS == nil:
		return nil, badInput(step, "ms", "required (milliseconds to sleep, ≥ 0)")
	case *in.MS < 0:
		return nil, badInput(step, "ms", "must be ≥ 0, got %d", *in.MS)
	case *in.MS > maxSleepMS:
		return nil, badInput(step, "ms", "must be ≤ %d, got %d", maxSleepMS, *in.MS)
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
