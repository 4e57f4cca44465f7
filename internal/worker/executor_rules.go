package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/rules"

	"github.com/stepready/stepready/steps"
)

func hasRules(doc json.RawMessage) bool {
	s := string(doc)
	return len(doc) > 0 && s != "null" && s != "[]"
}

// failUncompiledRules records the failure of an attempt whose step's rules do not compile (they can only arrive
// through plain SQL: every Go entry point validates). The handler has not run. The failure is `deterministic`
// and not retryable, and its message is the one rules.Validate gives for the same document when a task is
// created, `steps[i] "name": rules[j].when: <CEL message>`, with i the step's position in its task.
func (e *Executor) failUncompiledRules(ctx context.Context, log *slog.Logger, step *attempt, compileErr error) error {
	pos, err := store.StepPosition(ctx, e.Pool, step.ID)
	if err != nil {
		return err
	}
	var msg string
	if ce, ok := errors.AsType[*rules.CompileError](compileErr); ok {
		msg = (&rules.StepError{StepIndex: pos, Step: step.Name, Err: ce}).Error()
	} else {
		msg = fmt.Sprintf("steps[%d] %q: rules: %v", pos, step.Name, compileErr)
	}
	no := false
	log.Warn("executor: step rules do not compile; the handler was not run", slog.String("error", msg))
	return e.fail(ctx, log, step, errorDoc{Class: steps.ClassDeterministic, Message: msg, Retryable: &no})
}

// recordWithRules evaluates the step's outcome rules (SPEC §8) on the attempt's outcome, whatever it came to
// (success, repetition, handler error, timeout, abandoned handler, panic, unencodable output), and records the
// decision and the policy.evaluated event in one transaction. A rule that errors while evaluating is a
// `contract_failure` that keeps the attempt's own error in its message.
//
// When the handler returned steps.Repeat the rules see an ok outcome whose result is the iteration's output; a
// matching rule decides instead of the handler (break or continue complete the step, retry and fail fail the
// attempt, a repeat rule uses its delay_ms and its next_input, or the handler's next input when it has none),
// and when no rule matches the handler's repetition applies.
func (e *Executor) recordWithRules(ctx context.Context, log *slog.Logger, step *attempt, prog *rules.Program,
	o attemptOutcome) error {
	outcome := rules.Outcome{Result: o.output, Input: step.Input, Context: step.Context, Deps: step.Deps,
		Attempt:   step.Attempt,
		Iteration: step.Iteration, HTTPStatus: o.httpStatus}
	if d := o.failure; d != nil {
		outcome.Error = &rules.OutcomeError{Class: d.Class, Message: d.Message, Code: d.Code}
		outcome.HTTPStatus = d.HTTPStatus
	}
	dec, err := prog.Evaluate(ctx, outcome)
	if err != nil {
		if _, ok := errors.AsType[*rules.EvalError](err); !ok {
			return err
		}
		d := errorDoc{Class: steps.ClassContractFailure, Message: "step rules: " + err.Error()}
		if f := o.failure; f != nil {
			// Nothing of the attempt's own failure is lost: its class and message follow, its stack is kept.
			d.Message += fmt.Sprintf(" (the attempt had failed with class %s: %s)", f.Class, f.Message)
			d.Stack = f.Stack
		}
		return e.fail(ctx, log, step, d)
	}
	if !dec.Matched() && o.repeat != nil {
		dec = rules.Decision{Kind: rules.Repeat, RuleIndex: -1, NextInput: o.repeat.nextInput, Delay: o.repeat.delay}
	}
	if dec.Kind == rules.Repeat && dec.NextInput == nil && o.repeat != nil {
		dec.NextInput = o.repeat.nextInput
	}
	event := dec.EventDetails()
	if o.repeat != nil {
		event["handler_repeat"] = true
	}
	if o.failure != nil {
		// The attempt's failure as the rules saw it. A decision that completes or repeats the step records no
		// failure; this keeps its class, message and stack (a panic's) in the step's history all the same.
		event["error"] = o.failure
	}
	details, err := json.Marshal(event)
	if err != nil {
		return fmt.Errorf("steps: encode policy decision: %w", err)
	}
	// The event repeats the attempt's error, whose message jsonb may not hold as is (storable.go).
	if details, err = storableJSON(details, true); err != nil {
		return err
	}
	log = log.With(slog.String("decision", dec.Kind.String()), slog.Int("rule", dec.RuleIndex))
	return pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		if ok, err := store.RecordPolicyEvaluation(ctx, tx, step.ID, step.token, details); err != nil || !ok {
			if err == nil {
				log.Warn("executor: attempt fenced out before its outcome was recorded")
			}
			return err
		}
		return e.applyDecision(ctx, tx, log, step, dec, o.failure, o.output)
	})
}

func (e *Executor) applyDecision(ctx context.Context, tx pgx.Tx, log *slog.Logger, step *attempt, dec rules.Decision,
	doc *errorDoc, out json.RawMessage) error {
	if out == nil {
		out = json.RawMessage("null")
	}
	switch dec.Kind {
	case rules.Complete, rules.Continue, rules.Break:
		ok, err := store.CompleteStep(ctx, tx, step.ID, step.token, out)
		if err == nil {
			e.Metrics.Completed()
			log.Info("executor: attempt completed by rule", slog.Bool("recorded", ok))
		}
		return err
	case rules.Repeat:
		ok, err := store.ContinueStep(ctx, tx, step.ID, step.token, out, dec.NextInput, dec.Delay)
		if err == nil {
			e.Metrics.Completed()
			log.Info("executor: iteration done; rule repeats the step", slog.Bool("recorded", ok))
		}
		return err
	case rules.Retry:
		d := errorDoc{Class: steps.ClassTransient, Message: fmt.Sprintf("rule %d requested a retry", dec.RuleIndex)}
		if doc != nil {
			d = *doc
		}
		d.Retry, d.Rule = dec.RetryJSON(), dec.RuleRef()
		return e.failOn(ctx, tx, log, step, d)
	case rules.FailPermanent:
		d := errorDoc{Class: steps.ClassPermanent, Message: fmt.Sprintf("rule %d failed the step", dec.RuleIndex)}
		if doc != nil {
			d = *doc
		}
		if dec.Class != "" {
			d.Class = dec.Class
		}
		if dec.Message != "" {
			d.Message = dec.Message
		}
		no := false
		d.Retryable, d.Rule = &no, dec.RuleRef()
		return e.failOn(ctx, tx, log, step, d)
	default: // FailWithPolicy
		if doc == nil {
			return fmt.Errorf("steps: rules decided %s for a successful attempt", dec.Kind)
		}
		return e.failOn(ctx, tx, log, step, *doc)
	}
}
