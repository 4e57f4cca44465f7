// Package rules compiles and evaluates a step's outcome rules (SPEC §8) with CEL (cel.dev/cel-go, the
// google/cel-go project under its current module path).
//
// A step's `rules` is an ordered JSON list; after every attempt the first rule whose `when` is true decides,
// and a final `else` matches whatever is left:
//
//	[
//	  {"when": "outcome.status == 'error' && outcome.http.status in [429, 500, 502, 503, 504]",
//	   "then": {"do": "retry", "max_attempts": 10, "backoff": "exponential", "base_delay_ms": 2000}},
//	  {"when": "outcome.status == 'error' && outcome.http.status in [401, 403]", "then": {"do": "fail"}},
//	  {"else": {"do": "continue"}}
//	]
//
// # Variables
//
// Every expression is type-checked at Compile against these declarations; a misspelled variable or field of
// outcome is a compile error.
//
//	outcome.status          string  'ok' or 'error'
//	outcome.error.class     string  failure class ('' when ok)
//	outcome.error.message   string  error message ('' when ok)
//	outcome.error.code      string  SQLSTATE, HTTP status text, exit code… ('' when none)
//	outcome.http.status     int     HTTP status of the attempt's call, failed or successful (0 when none)
//	outcome.result          dyn     the attempt's output (JSON; null when the attempt failed)
//	attempt                 int     1-based attempt number within the iteration
//	iteration               int     0-based iteration of a repeating step
//	input                   dyn     the step's input for this iteration (JSON)
//	context                 dyn     the task's context (JSON)
//	deps                    dyn     the direct parents' outputs by step name (SPEC §18; {} when none)
//
// JSON values map to CEL as objects → map, arrays → list, strings, booleans, null, and numbers → int when
// integral and within int64 (so `outcome.result.page + 1` works), double otherwise. Fields of a dyn value are
// checked only when the rule runs: `outcome.result.cursor` on a result without `cursor` is an evaluation error;
// test for it first with `has(outcome.result.cursor)` or use `outcome.result.?cursor.orValue(null)`. The
// standard CEL library, the strings extension (`lowerAscii`, `split`, …) and optional types are available.
//
// # Actions and the decision table
//
// A `when` must have type bool (dyn is accepted and checked at run time). The `then` (or `else`) object has a
// `do` and only that action's fields; any other field is rejected with the rule's index.
//
//	do        fields                                           Decision     executor calls
//	retry     max_attempts, backoff, base_delay_ms,            Retry        fail_step, p_error.retry = overrides
//	          max_delay_ms (overrides for this failure)
//	fail      class, message (optional)                        FailPermanent fail_step, p_error.retryable = false
//	continue  —                                                Continue     complete_step (even after an error)
//	repeat    next_input (CEL map), delay_ms                   Repeat       continue_step(output, next input, delay)
//	break     —                                                Break        complete_step
//	no match, ok outcome                                       Complete     complete_step
//	no match, error outcome                                    FailWithPolicy fail_step with the step's policy
//
// `next_input` is evaluated with the same variables as `when` and must produce a map, which becomes the next
// iteration's input (a JSON object); without it the input is kept. A Retry still goes through fail_step's
// decision order: a non-retryable class, an open circuit breaker or an exhausted (overridden) budget ends the
// step, and a handler's retry_after_ms is used instead of the backoff.
//
// # Errors
//
// Compile returns a *CompileError (`rules[1].when: <CEL message>`); Validate wraps it per step in a *StepError
// (`steps[2] "fetch": rules[1].when: …`). A rule that compiles but fails while running is an *EvalError, which
// the executor records as a failure of class `contract_failure`. A document that reaches the daemon without
// having been validated (plain SQL inserts) and does not compile fails its step with class `deterministic`
// before the handler runs, with the *StepError message Validate gives for the same rules.
//
// # Bounds
//
// Compiled programs are cached by the SHA-256 of the document (CacheSize entries, least recently used dropped),
// so compiling once per attempt is cheap. Documents hold at most MaxRules rules and expressions at most
// MaxExpressionLength bytes; each evaluation is capped at CostLimit and checks its context inside
// comprehensions. Compile and Evaluate recover from panics inside CEL and return them as errors.
package rules
