package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/rules"
)

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

func hasRules(doc json.RawMessage) bool {
	s := string(doc)
	return len(doc) > 0 && s != "null" && s != "[]"
}

// recordWithRules evaluates the step's outcome rules (SPEC §8) on the attempt's outcome and records the decision
// and the policy.evaluated event in one transaction. A rules document that does not compile (it can only arrive
// through plain SQL: every Go entry point validates) fails the step as `deterministic`, never retried; a rule
// that errors while evaluating is a `contract_failure`.
func (e *Executor) recordWithRules(ctx context.Context, log *slog.Logger, step *Step, r result) error {
	prog, err := rules.Compile(step.Rules)
	if err != nil {
		no := false
		return e.fail(ctx, log, step, errorDoc{Class: ClassDeterministic, Message: "step rules: " + err.Error(), Retryable: &no})
	}
	var doc *errorDoc
	var out json.RawMessage
	if r.err != nil {
		d := classify(r.err, r.timedOut)
		doc = &d
	} else if out, err = encodeJSON(r.output); err != nil {
		return e.fail(ctx, log, step, errorDoc{Class: ClassContractFailure, Message: err.Error()})
	}
	outcome := rules.Outcome{Result: out, Input: step.Input, Context: step.Context, Attempt: step.Attempt,
		Iteration: step.Iteration}
	if doc != nil {
		outcome.Error = &rules.OutcomeError{Class: doc.Class, Message: doc.Message, Code: doc.Code}
		outcome.HTTPStatus = doc.HTTPStatus
	} else if s, ok := r.output.(OutputWithHTTPStatus); ok {
		outcome.HTTPStatus = s.HTTPStatus()
	}
	dec, err := prog.Evaluate(ctx, outcome)
	if err != nil {
		var evalErr *rules.EvalError
		if errors.As(err, &evalErr) {
			return e.fail(ctx, log, step, errorDoc{Class: ClassContractFailure, Message: "step rules: " + err.Error()})
		}
		return err
	}
	details, err := json.Marshal(dec.EventDetails())
	if err != nil {
		return fmt.Errorf("steps: encode policy decision: %w", err)
	}
	log = log.With(slog.String("decision", dec.Kind.String()), slog.Int("rule", dec.RuleIndex))
	return pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		if ok, err := store.RecordPolicyEvaluation(ctx, tx, step.ID, step.Attempt, details); err != nil || !ok {
			if err == nil {
				log.Warn("executor: attempt fenced out before its outcome was recorded")
			}
			return err
		}
		return e.applyDecision(ctx, tx, log, step, dec, doc, out)
	})
}

func (e *Executor) applyDecision(ctx context.Context, tx pgx.Tx, log *slog.Logger, step *Step, dec rules.Decision,
	doc *errorDoc, out json.RawMessage) error {
	if out == nil {
		out = json.RawMessage("null")
	}
	switch dec.Kind {
	case rules.Complete, rules.Continue, rules.Break:
		ok, err := store.CompleteStep(ctx, tx, step.ID, step.Attempt, out)
		if err == nil {
			e.Metrics.Completed()
			log.Info("executor: attempt completed by rule", slog.Bool("recorded", ok))
		}
		return err
	case rules.Repeat:
		ok, err := store.ContinueStep(ctx, tx, step.ID, step.Attempt, out, dec.NextInput, dec.Delay)
		if err == nil {
			e.Metrics.Completed()
			log.Info("executor: iteration done; rule repeats the step", slog.Bool("recorded", ok))
		}
		return err
	case rules.Retry:
		d := errorDoc{Class: ClassTransient, Message: fmt.Sprintf("rule %d requested a retry", dec.RuleIndex)}
		if doc != nil {
			d = *doc
		}
		d.Retry, d.Rule = dec.RetryJSON(), dec.RuleRef()
		return e.failOn(ctx, tx, log, step, d)
	case rules.FailPermanent:
		d := errorDoc{Class: ClassPermanent, Message: fmt.Sprintf("rule %d failed the step", dec.RuleIndex)}
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
