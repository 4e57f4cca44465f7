package builtin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/steps"
)

// Options configures the built-in handlers installed by Register. The zero value registers every handler except
// `sql`, with `exec` disabled and a default HTTP client.
type Options struct {
	// Pool is the PostgreSQL pool the `sql` handler runs step SQL on. Nil (the default) registers a `sql` that
	// fails every step `permanent`, saying how to enable it. Give it a pool of its own, on a role with the
	// rights step SQL needs and none of stepready's (docs/security.md: `scheduler run --sql-database-url`), never the
	// scheduler's pool: whoever can insert a step could otherwise rewrite stepready's tables with the
	// scheduler's rights.
	Pool *pgxpool.Pool

	// AllowExec lets the `exec` handler run programs on the scheduler's host, with the scheduler's user,
	// privileges and environment. Default false: `exec` is still registered, so that a step asking for it fails
	// with an explicit permanent error ("exec handler is disabled … --allow-exec") instead of an unknown-handler
	// error, but it never starts a process. Enable it only when whoever can insert steps may run commands there.
	AllowExec bool

	// HTTPClient is the client the `http` handler sends its requests with. Nil (the default) means a client of
	// its own with a 10 s dial timeout, a 10 s TLS handshake timeout, TCP keep-alive, proxies from the environment
	// and no overall timeout: the step's timeout, carried by the handler's context, bounds each request. A client
	// given here is used as is; its Timeout, when set, cuts requests short independently of the step's timeout
	// (such a failure is classified `timeout` too).
	HTTPClient *http.Client

	// HTTPGuard restricts the addresses the default HTTP client connects to (docs/security.md): link-local addresses
	// (cloud metadata) are refused always, loopback and private ranges too with DenyPrivate, AllowHosts listing
	// exceptions. It applies to the default client only: a client given as HTTPClient is used as is.
	HTTPGuard HTTPGuard
}

// Timeouts of the default HTTP client (see Options.HTTPClient).
const (
	defaultHTTPDialTimeout         = 10 * time.Second
	defaultHTTPTLSHandshakeTimeout = 10 * time.Second
	defaultHTTPKeepAlive           = 30 * time.Second
	defaultHTTPIdleConnTimeout     = 90 * time.Second
)

// Register adds the built-in handlers to reg: `noop`, `sleep`, `fail`, `http`, `exec` (disabled unless
// opts.AllowExec) and, when opts.Pool is set, `sql`. It fails, registering nothing more, when one of these names
// is already taken in reg.
func Register(reg *steps.Registry, opts Options) error {
	client := opts.HTTPClient
	if client == nil {
		if err := opts.HTTPGuard.Validate(); err != nil {
			return fmt.Errorf("builtin: %w", err)
		}
		client = newDefaultHTTPClient(&opts.HTTPGuard)
	}

	handlers := []registration{
		{"noop", steps.HandlerFunc(handleNoop)},
		{"sleep", steps.HandlerFunc(handleSleep)},
		{"fail", steps.HandlerFunc(handleFail)},
		{"http", newHTTPHandler(client)},
	}
	if opts.Pool != nil {
		handlers = append(handlers, registration{"sql", &sqlHandler{pool: opts.Pool}})
	} else {
		handlers = append(handlers, registration{"sql", steps.HandlerFunc(handleSQLDisabled)})
	}
	if opts.AllowExec {
		handlers = append(handlers, registration{"exec", &execHandler{}})
	} else {
		handlers = append(handlers, registration{"exec", steps.HandlerFunc(handleExecDisabled)})
	}

	for _, h := range handlers {
		if err := reg.Register(h.name, h.handler); err != nil {
			return fmt.Errorf("builtin: %w", err)
		}
	}
	return nil
}

// registration is one handler Register adds.
type registration struct {
	name    string
	handler steps.Handler
}

// newDefaultHTTPClient returns the client used when Options.HTTPClient is nil; guard checks every address it
// connects to. Through a proxy (HTTPS_PROXY and friends) the address connected to is the proxy's.
func newDefaultHTTPClient(guard *HTTPGuard) *http.Client {
	dialer := &net.Dialer{Timeout: defaultHTTPDialTimeout, KeepAlive: defaultHTTPKeepAlive}
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           guard.dialContext(dialer),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   10,
		IdleConnTimeout:       defaultHTTPIdleConnTimeout,
		TLSHandshakeTimeout:   defaultHTTPTLSHandshakeTimeout,
		ExpectContinueTimeout: time.Second,
	}}
}

// decodeInput decodes the step's input into v (a pointer to an input struct) through step.DecodeInput, rejecting
// fields v does not have, so that a misspelt field is a clear permanent error instead of a silently ignored one.
// Empty and null input leave v untouched.
func decodeInput(step *steps.Step, v any) error {
	return step.DecodeInput(&strictJSON{v: v})
}

// strictJSON decodes into v with unknown fields disallowed. json.Unmarshal (inside Step.DecodeInput) has
// already checked that the input is exactly one valid JSON value when it calls UnmarshalJSON.
type strictJSON struct{ v any }

// UnmarshalJSON implements json.Unmarshaler.
func (s *strictJSON) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(s.v)
}

// badInput returns the permanent error for input that decodes but is not acceptable; the message names the
// field.
func badInput(step *steps.Step, field, format string, args ...any) error {
	return steps.Permanent(&steps.InputError{
		Step: step.Name,
		Err:  fmt.Errorf("field %q: %s", field, fmt.Sprintf(format, args...)),
	})
}
