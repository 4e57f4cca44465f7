package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/ext"
)

// Evaluation bounds.
const (
	// CostLimit bounds the runtime cost of one expression evaluation (CEL cost units: roughly one per operation,
	// plus the size of the strings and lists touched). An evaluation that exceeds it fails with an *EvalError.
	CostLimit = 1_000_000
	// interruptEvery is how many comprehension iterations run between two checks of the context.
	interruptEvery = 100
	// maxOutputDepth bounds the nesting of a next_input value converted back to JSON.
	maxOutputDepth = 100
)

// Names of the CEL variables (SPEC §8). See the package documentation for their types.
const (
	varOutcome   = "outcome"
	varAttempt   = "attempt"
	varIteration = "iteration"
	varInput     = "input"
	varContext   = "context"
	varDeps      = "deps"
)

// outcomeVar is the CEL type of `outcome`. Its fields are always present: a successful attempt has an empty
// error, an attempt that made no HTTP call has http.status 0.
type outcomeVar struct {
	Status string   `cel:"status"`
	Error  errorVar `cel:"error"`
	HTTP   httpVar  `cel:"http"`
	Result any      `cel:"result"`
}

// errorVar is the CEL type of `outcome.error`.
type errorVar struct {
	Class   string `cel:"class"`
	Message string `cel:"message"`
	Code    string `cel:"code"`
}

// httpVar is the CEL type of `outcome.http`.
type httpVar struct {
	Status int64 `cel:"status"`
}

var (
	envOnce sync.Once
	envVal  *cel.Env
	envErr  error
)

// celEnv returns the one CEL environment every rule is compiled in. A cel.Env is safe for concurrent use.
func celEnv() (*cel.Env, error) {
	envOnce.Do(func() {
		envVal, envErr = cel.NewEnv(
			ext.NativeTypes(reflect.TypeFor[outcomeVar](), reflect.TypeFor[errorVar](), reflect.TypeFor[httpVar](),
				ext.ParseStructTags(true)),
			cel.Variable(varOutcome, cel.ObjectType("rules.outcomeVar")),
			cel.Variable(varAttempt, cel.IntType),
			cel.Variable(varIteration, cel.IntType),
			cel.Variable(varInput, cel.DynType),
			cel.Variable(varContext, cel.DynType),
			cel.Variable(varDeps, cel.DynType),
			ext.Strings(),
			cel.OptionalTypes(),
			cel.ParserExpressionSizeLimit(MaxExpressionLength),
		)
		if envErr == nil {
			// cel-go v0.33 fills its checker's symbol catalog lazily, the first time a check reports an
			// undeclared reference, while checks of comprehensions on other goroutines read the same field
			// unguarded (a data race the race detector reports in our parallel tests). Fill it here, once,
			// before the environment is shared: an expression naming an undeclared variable does it.
			_, _ = envVal.Compile("stepready_fill_the_catalog")
		}
	})
	return envVal, envErr
}

// programOptions bound every evaluation.
func programOptions() []cel.ProgramOption {
	return []cel.ProgramOption{cel.CostLimit(CostLimit), cel.InterruptCheckFrequency(interruptEvery)}
}

// decodeJSON turns a JSON document into the values CEL sees: objects → map[string]any, arrays → []any,
// integral numbers that fit → int64 (so `outcome.result.page + 1` is int arithmetic), other numbers → float64.
// Empty input is null.
func decodeJSON(doc []byte) (any, error) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("trailing data after the JSON value")
	}
	return numbers(v), nil
}

func numbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n
		}
		f, _ := v.Float64() // a syntactically valid JSON number: out of range gives ±Inf, kept as is
		return f
	case map[string]any:
		for k, e := range v {
			v[k] = numbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = numbers(e)
		}
	}
	return v
}

// toJSON converts a CEL value back to something encoding/json writes faithfully. It refuses what JSON cannot
// hold (NaN, infinities, non-string map keys, types, optionals) instead of guessing.
func toJSON(v ref.Val, depth int) (any, error) {
	if depth > maxOutputDepth {
		return nil, fmt.Errorf("value nested deeper than %d levels", maxOutputDepth)
	}
	switch v := v.(type) {
	case types.Null:
		return nil, nil
	case types.Bool:
		return bool(v), nil
	case types.Int:
		return int64(v), nil
	case types.Uint:
		return uint64(v), nil
	case types.Double:
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%v is not a JSON number", v)
		}
		return float64(v), nil
	case types.String:
		return string(v), nil
	case types.Bytes:
		return []byte(v), nil // base64, as encoding/json writes bytes
	case types.Duration, types.Timestamp:
		return v.ConvertToType(types.StringType).Value(), nil
	case traits.Mapper:
		out := map[string]any{}
		for it := v.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			ks, ok := k.(types.String)
			if !ok {
				return nil, fmt.Errorf("map key %v is a %s, JSON object keys are strings", k, k.Type())
			}
			e, err := toJSON(v.Get(k), depth+1)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", string(ks), err)
			}
			out[string(ks)] = e
		}
		return out, nil
	case traits.Lister:
		var out []any
		for it := v.Iterator(); it.HasNext() == types.True; {
			e, err := toJSON(it.Next(), depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, e)
		}
		if out == nil {
			out = []any{}
		}
		return out, nil
	case *types.Err:
		return nil, v
	}
	return nil, fmt.Errorf("a value of type %s has no JSON form", v.Type())
}
