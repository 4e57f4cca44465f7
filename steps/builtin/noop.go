package builtin

import (
	"context"
	"encoding/json"

	"github.com/stepready/stepready/steps"
)

// handleNoop is the `noop` handler: it completes at once with its input as output ({} when the input is empty).
func handleNoop(_ context.Context, step *steps.Step) (any, error) {
	var raw json.RawMessage
	if err := step.DecodeInput(&raw); err != nil { // validates the JSON; any shape is accepted
		return nil, err
	}
	if len(step.Input) == 0 {
		return json.RawMessage(`{}`), nil
	}
	return step.Input, nil
}
