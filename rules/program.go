package rules

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
)

// CacheSize is how many distinct rules documents (compiled programs and compile errors) the process keeps. The
// least recently used entry is dropped beyond it.
const CacheSize = 1024

// Program is a compiled rules document: every `when` and `next_input` parsed, type-checked and planned. It is
// immutable and safe for concurrent use; Compile hands out the same *Program for the same document.
type Program struct {
	rules []compiledRule
}

type compiledRule struct {
	Rule
	when cel.Program // nil for else
	next cel.Program // nil without next_input
}

// Rules returns the parsed rules, in order.
func (p *Program) Rules() []Rule {
	out := make([]Rule, len(p.rules))
	for i, r := range p.rules {
		out[i] = r.Rule
	}
	return out
}

// Compile parses a step's `rules` JSON and compiles every expression against the variables of SPEC §8 (see the
// package documentation). A `when` must have type bool (or dyn, checked when it runs); a `next_input` must
// produce a map (or dyn). null, empty input and [] compile to a Program without rules, which always decides
// the default. Any problem is a *CompileError naming the rule and field.
//
// Results, errors included, are cached by the SHA-256 of rulesJSON: compiling the same document again (every
// attempt of every step sharing a definition) returns the same *Program without recompiling. Postgres
// normalizes jsonb, so the same rules read back from the database are byte-identical.
func Compile(rulesJSON []byte) (*Program, error) {
	key := sha256.Sum256(rulesJSON)
	if p, err, ok := cache.get(key); ok {
		return p, err
	}
	p, err := compile(rulesJSON)
	return cache.put(key, p, err)
}

func compile(doc []byte) (p *Program, err error) {
	defer func() {
		if r := recover(); r != nil {
			p, err = nil, &CompileError{Index: -1, Msg: fmt.Sprintf("internal error compiling rules: %v", r)}
		}
	}()
	rules, err := parse(doc)
	if err != nil {
		return nil, err
	}
	env, err := celEnv()
	if err != nil {
		return nil, fmt.Errorf("rules: CEL environment: %w", err)
	}
	p = &Program{rules: make([]compiledRule, len(rules))}
	for i, r := range rules {
		c := compiledRule{Rule: r}
		if !r.Else {
			c.when, err = compileExpr(env, i, "when", r, r.When, types.BoolType)
			if err != nil {
				return nil, err
			}
		}
		if r.Then.NextInput != "" {
			field := "then.next_input"
			if r.Else {
				field = "else.next_input"
			}
			c.next, err = compileExpr(env, i, field, r, r.Then.NextInput, types.MapType)
			if err != nil {
				return nil, err
			}
		}
		p.rules[i] = c
	}
	return p, nil
}

// compileExpr compiles one expression and checks its result type: want (bool or map) or dyn.
func compileExpr(env *cel.Env, i int, field string, r Rule, src string, want *types.Type) (cel.Program, error) {
	fail := func(msg string) (cel.Program, error) {
		return nil, &CompileError{Index: i, Field: field, Rule: r.Text(), Msg: msg}
	}
	if len(src) > MaxExpressionLength {
		return fail(fmt.Sprintf("expression is %d bytes long, at most %d are allowed", len(src), MaxExpressionLength))
	}
	ast, iss := env.Compile(src)
	if iss != nil && iss.Err() != nil {
		return fail(strings.TrimSpace(iss.Err().Error()))
	}
	out := ast.OutputType()
	ok := out.IsExactType(types.DynType) || out.Kind() == want.Kind()
	if !ok {
		what := "a bool"
		if want.Kind() == types.MapType.Kind() {
			what = "a map (the next input object)"
		}
		return fail(fmt.Sprintf("must evaluate to %s, but %q has type %s", what, src, out))
	}
	prg, err := env.Program(ast, programOptions()...)
	if err != nil {
		return fail(err.Error())
	}
	return prg, nil
}

// Outcome is what one attempt came to, plus the step's state: everything a rule can look at.
type Outcome struct {
	// Error is the attempt's classified failure; nil when the attempt succeeded (`outcome.status == 'ok'`).
	Error *OutcomeError
	// HTTPStatus is the HTTP status of the call the attempt made (`outcome.http.status`), whether the attempt
	// failed or succeeded; 0 when none. The executor takes it from the handler's error (steps.Error.HTTPStatus)
	// or, on success, from an output implementing steps.OutputWithHTTPStatus.
	HTTPStatus int
	// Result is the attempt's output as JSON (`outcome.result`); empty means null.
	Result json.RawMessage
	// Input is the step's input for this iteration (`input`); empty means null.
	Input json.RawMessage
	// Context is the task's context (`context`); empty means null.
	Context json.RawMessage
	// Deps is the step's deps object (`deps`: its direct parents' outputs by name, SPEC §18); empty means {}.
	Deps json.RawMessage
	// Attempt is the 1-based attempt number within the iteration (`attempt`).
	Attempt int
	// Iteration is the 0-based iteration of a repeating step (`iteration`).
	Iteration int
}

// OutcomeError is the failure side of an Outcome (`outcome.error`).
type OutcomeError struct {
	// Class is the failure class (`outcome.error.class`), e.g. transient, timeout, permanent.
	Class string
	// Message is the error message (`outcome.error.message`).
	Message string
	// Code is the machine-readable code (`outcome.error.code`): a SQLSTATE, an HTTP status text, an exit code.
	Code string
}

// Outcome status values (`outcome.status`).
const (
	StatusOK    = "ok"
	StatusError = "error"
)

// Status is the value of `outcome.status`: "error" when the attempt failed, else "ok".
func (o Outcome) Status() string {
	if o.Error != nil {
		return StatusError
	}
	return StatusOK
}

func (o Outcome) activation() (map[string]any, error) {
	out := outcomeVar{Status: o.Status(), HTTP: httpVar{Status: int64(o.HTTPStatus)}}
	if o.Error != nil {
		out.Error = errorVar{Class: o.Error.Class, Message: o.Error.Message, Code: o.Error.Code}
	}
	var err error
	if out.Result, err = decodeJSON(o.Result); err != nil {
		return nil, fmt.Errorf("outcome.result is not valid JSON: %w", err)
	}
	input, err := decodeJSON(o.Input)
	if err != nil {
		return nil, fmt.Errorf("input is not valid JSON: %w", err)
	}
	tctx, err := decodeJSON(o.Context)
	if err != nil {
		return nil, fmt.Errorf("context is not valid JSON: %w", err)
	}
	var deps any = map[string]any{}
	if len(o.Deps) > 0 {
		if deps, err = decodeJSON(o.Deps); err != nil {
			return nil, fmt.Errorf("deps is not valid JSON: %w", err)
		}
	}
	return map[string]any{
		varDeps:      deps,
		varOutcome:   out,
		varAttempt:   int64(o.Attempt),
		varIteration: int64(o.Iteration),
		varInput:     input,
		varContext:   tctx,
	}, nil
}

// Evaluate runs the rules against an outcome, first match wins, and returns the decision. Without rules, or
// when none matches and there is no else, the default applies: an ok outcome completes, an error fails through
// fail_step with the step's policy (RuleIndex -1).
//
// A rule that fails at run time returns an *EvalError (record it as class `contract_failure`). A cancelled
// ctx returns ctx's error (not an *EvalError): the evaluation did not fail, it was stopped. Evaluation is
// bounded by CostLimit and never panics.
func (p *Program) Evaluate(ctx context.Context, o Outcome) (d Decision, err error) {
	idx, text := -1, ""
	defer func() {
		if r := recover(); r != nil {
			d, err = Decision{}, &EvalError{Index: idx, Rule: text, Err: fmt.Errorf("internal error: %v", r)}
		}
	}()
	if p == nil || len(p.rules) == 0 {
		return defaultDecision(o), nil
	}
	vars, err := o.activation()
	if err != nil {
		return Decision{}, &EvalError{Index: -1, Err: err}
	}
	for i, r := range p.rules {
		idx, text = i, r.Text()
		if !r.Else {
			v, _, err := r.when.ContextEval(ctx, vars)
			if err != nil {
				if cerr := ctx.Err(); cerr != nil {
					return Decision{}, cerr
				}
				return Decision{}, &EvalError{Index: i, Field: "when", Rule: text, Err: err}
			}
			b, ok := v.(types.Bool)
			if !ok {
				return Decision{}, &EvalError{Index: i, Field: "when", Rule: text,
					Err: fmt.Errorf("got a %s, want a bool", v.Type())}
			}
			if !b {
				continue
			}
		}
		return r.decide(ctx, i, vars)
	}
	return defaultDecision(o), nil
}

func (r compiledRule) decide(ctx context.Context, i int, vars map[string]any) (Decision, error) {
	d := Decision{RuleIndex: i, RuleText: r.Text()}
	a := r.Then
	switch a.Do {
	case DoRetry:
		d.Kind = Retry
		if a.MaxAttempts != nil || a.Backoff != "" || a.BaseDelayMS != nil || a.MaxDelayMS != nil {
			d.Retry = &RetryOverride{MaxAttempts: a.MaxAttempts, Backoff: a.Backoff, BaseDelayMS: a.BaseDelayMS,
				MaxDelayMS: a.MaxDelayMS}
		}
	case DoFail:
		d.Kind, d.Class, d.Message = FailPermanent, a.Class, a.Message
	case DoContinue:
		d.Kind = Continue
	case DoBreak:
		d.Kind = Break
	case DoRepeat:
		d.Kind, d.Delay = Repeat, time.Duration(min(a.DelayMS, int64(1<<63-1)/int64(time.Millisecond)))*time.Millisecond
		if r.next != nil {
			field := "then.next_input"
			if r.Else {
				field = "else.next_input"
			}
			fail := func(err error) (Decision, error) {
				return Decision{}, &EvalError{Index: i, Field: field, Rule: d.RuleText, Err: err}
			}
			v, _, err := r.next.ContextEval(ctx, vars)
			if err != nil {
				if cerr := ctx.Err(); cerr != nil {
					return Decision{}, cerr
				}
				return fail(err)
			}
			j, err := toJSON(v, 0)
			if err != nil {
				return fail(err)
			}
			if _, ok := j.(map[string]any); !ok {
				return fail(fmt.Errorf("got a %s, want a map (the next input object)", v.Type()))
			}
			if d.NextInput, err = json.Marshal(j); err != nil {
				return fail(err)
			}
		}
	default:
		return Decision{}, &EvalError{Index: i, Rule: d.RuleText, Err: fmt.Errorf("unknown action %q", a.Do)}
	}
	return d, nil
}

func defaultDecision(o Outcome) Decision {
	if o.Error != nil {
		return Decision{Kind: FailWithPolicy, RuleIndex: -1}
	}
	return Decision{Kind: Complete, RuleIndex: -1}
}

// cache is the process-wide LRU of compiled documents.
var cache = newLRU(CacheSize)

type lru struct {
	mu    sync.Mutex
	size  int
	order *list.List // front = most recently used; values are *lruEntry
	items map[[sha256.Size]byte]*list.Element
}

type lruEntry struct {
	key  [sha256.Size]byte
	prog *Program
	err  error
}

func newLRU(size int) *lru {
	return &lru{size: size, order: list.New(), items: map[[sha256.Size]byte]*list.Element{}}
}

func (c *lru) get(key [sha256.Size]byte) (*Program, error, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		return nil, nil, false
	}
	c.order.MoveToFront(el)
	e := el.Value.(*lruEntry)
	return e.prog, e.err, true
}

// put stores a result and returns the stored one: when a concurrent Compile of the same document stored first,
// its result wins so that every caller shares one *Program. An error that is not a *CompileError (the
// environment failed) is not cached.
func (c *lru) put(key [sha256.Size]byte, p *Program, err error) (*Program, error) {
	if _, ok := errors.AsType[*CompileError](err); err != nil && !ok {
		return p, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.order.MoveToFront(el)
		e := el.Value.(*lruEntry)
		return e.prog, e.err
	}
	c.items[key] = c.order.PushFront(&lruEntry{key: key, prog: p, err: err})
	for c.order.Len() > c.size {
		old := c.order.Back()
		c.order.Remove(old)
		delete(c.items, old.Value.(*lruEntry).key)
	}
	return p, err
}

func (c *lru) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
