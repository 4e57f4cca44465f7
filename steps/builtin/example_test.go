package builtin_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/steps/builtin"
)

// The fail handler fails its first attempts, then succeeds: a step that asks for it shows the retry policy at
// work. Attempts are run by hand here; the daemon runs them as the step's policy schedules them.
func Example() {
	reg := steps.NewRegistry()
	if err := builtin.Register(reg, builtin.Options{}); err != nil {
		panic(err)
	}
	fmt.Println(reg.Names())

	fail, _ := reg.Lookup("fail")
	for attempt := 1; attempt <= 3; attempt++ {
		step := &steps.Step{Name: "flaky", Handler: "fail", Attempt: attempt, Input: json.RawMessage(`{"times": 2}`)}
		out, err := fail.Handle(context.Background(), step)
		if err != nil {
			fmt.Println("attempt", attempt, "failed:", err)
			continue
		}
		b, _ := json.Marshal(out)
		fmt.Println("attempt", attempt, "output:", string(b))
	}
	// Output:
	// [exec fail http noop sleep sql]
	// attempt 1 failed: transient: fail handler: attempt 1 of 2 fails
	// attempt 2 failed: transient: fail handler: attempt 2 of 2 fails
	// attempt 3 output: {"attempts":3}
}

// Without Options.AllowExec, exec is registered but refuses to run anything.
func Example_execDisabled() {
	reg := steps.NewRegistry()
	if err := builtin.Register(reg, builtin.Options{}); err != nil {
		panic(err)
	}
	exec, _ := reg.Lookup("exec")
	_, err := exec.Handle(context.Background(), &steps.Step{Name: "deploy", Attempt: 1,
		Input: json.RawMessage(`{"command": ["make", "deploy"]}`)})
	failure, _ := steps.AsError(err)
	fmt.Println(failure.Class, failure.Code)
	// Output:
	// permanent exec_disabled
}
