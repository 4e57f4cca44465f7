package rules

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Validate compiles the rules of every step of a task definition (the JSON of docs/functions.md, as given to
// stepready.create_task or stored in a template) and reports each step whose rules do not compile, as a
// *StepError: `steps[2] "fetch": rules[1].when: <CEL message>`. Several bad steps are joined with errors.Join,
// in step order. Every Go entry point calls it before create_task: Postgres cannot compile CEL, so this is where
// a bad expression is caught at definition time.
//
// Validate checks only rules. The rest of the definition (names, dependencies, presets, numbers) is validated
// by stepready.create_task; a definition too malformed to find its steps (not a JSON object, `steps` not an
// array) is reported as a plain error and left for SQL to describe in full.
func Validate(definitionJSON []byte) error {
	var def struct {
		Steps []json.RawMessage `json:"steps"`
	}
	if err := json.Unmarshal(definitionJSON, &def); err != nil {
		return fmt.Errorf("definition: %s", jsonMsg(err))
	}
	var errs []error
	for i, raw := range def.Steps {
		var st struct {
			Name  json.RawMessage `json:"name"`
			Rules json.RawMessage `json:"rules"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			continue // not an object: create_task says so
		}
		if len(st.Rules) == 0 {
			continue
		}
		var name string
		_ = json.Unmarshal(st.Name, &name) // a missing or non-string name is create_task's to report
		if _, err := Compile(st.Rules); err != nil {
			ce, ok := errors.AsType[*CompileError](err)
			if !ok {
				return err
			}
			errs = append(errs, &StepError{StepIndex: i, Step: name, Err: ce})
		}
	}
	return errors.Join(errs...)
}
