// Package builtin provides the handlers every stepready scheduler ships with: noop, sleep, fail, http, sql and
// exec. Register installs them in a steps.Registry:
//
//	reg := steps.NewRegistry()
//	err := builtin.Register(reg, builtin.Options{Pool: stepSQLPool, AllowExec: allowExec})
//
// # Input, output and failures
//
// Each handler reads its step's JSON input (steps.input), returns a JSON output (recorded as the step's output,
// visible to rules as outcome.result) or fails the attempt with a failure class that the step's retry policy
// and rules then act on. The rules that decide whether and when to retry live in SQL; a handler only says what
// happened.
//
// Input is decoded strictly: a field the handler does not know ("url" spelt "uri"), a value of the wrong JSON
// type, or a value out of range fails the attempt with class `permanent` and a message naming the field
// (a *steps.InputError), because the same input would fail the same way on every attempt. Empty input and
// JSON null count as {}.
//
// When the step's timeout expires, the handler's context deadline passes and the attempt fails with class
// `timeout`. When the daemon shuts down, the context is cancelled and the handler returns the wrapped
// context error at once; the daemon hands such an attempt back uncharged.
//
// # noop
//
// Completes at once. Output: the input, unchanged (any JSON value); {} when the input is empty. Never fails.
//
// # sleep
//
// Input: {"ms": N}, N ≥ 0 required. Waits N milliseconds, then outputs {"slept_ms": N}. It returns as soon as
// its context is done, with the context's error wrapped (the step's timeout: class `timeout`). A missing or
// negative ms is `permanent`.
//
// # fail
//
// For demos and tests of retry policies. Input:
//
//	{"times": N, "class": "transient", "message": "…", "retry_after_ms": M}
//
// Attempts 1 to N (steps.Step.Attempt ≤ N) fail with the given class (default `transient`) and message
// (default "fail handler: attempt A of N fails"); with retry_after_ms they ask for the next attempt exactly M
// ms later (steps.FailAfter), bypassing the backoff. Later attempts succeed with output {"attempts": A}. Every
// field is optional: {} succeeds on the first attempt. A negative times or retry_after_ms is `permanent`.
//
// # http
//
// Sends one HTTP request. Input:
//
//	{
//	  "method":  "POST",                         // default GET; case-insensitive
//	  "url":     "https://api.example.com/jobs", // required; http or https
//	  "query":   {"page": 2, "tag": ["a", "b"]}, // optional, merged into the URL's query string
//	  "headers": {"Authorization": "Bearer …"},  // one value per header
//	  "body":    {"name": "x"},                  // optional, see below
//	  "expect":  [200, 201]                      // statuses that complete the step; default any 2xx
//	}
//
// A string body is sent as is (set its Content-Type in headers); any other JSON value is sent JSON-encoded with
// Content-Type: application/json unless headers set another. Redirects are followed as the client decides (the
// default client: up to 10).
//
// query exists for repeating steps (pagination): a rule's next_input can change one parameter without
// rebuilding the URL. Each key replaces every value of that parameter in url; a value is a string, a number
// (sent as written), a boolean, a list of these (the parameter repeated) or null (the parameter removed). When
// query is set, the query string is re-encoded with its parameters sorted by name.
//
// Output: {"status": 200, "headers": {"Content-Type": "…"}, "body": …}, with the first value of each response
// header under its canonical name, and the body as the JSON value itself when the response is JSON
// (application/json or a +json type) and parses, else as a string. A body kept as a string is made text the step's
// output can hold: invalid UTF-8 and NUL bytes become U+FFFD (jsonb cannot store them, and where they were the
// body was not text). A JSON body goes through the executor like any output: invalid UTF-8 and lone surrogate
// escapes become U+FFFD, a NUL in one of its strings fails the attempt (`contract_failure`, naming the path:
// a JSON body's data is not silently changed), and a value the database refuses (a number beyond numeric's
// range) fails it with the database's message. A body larger than MaxHTTPBodyBytes (10 MiB)
// fails the attempt (`permanent`) rather than being truncated. The output implements
// steps.OutputWithHTTPStatus, so outcome rules see the status of a successful call as outcome.http.status too.
//
// Failures, with the status in steps.Error.HTTPStatus (outcome.http.status) and as text in Code ("503"):
//   - 429 and 5xx: `transient`. A Retry-After header, in seconds or as an HTTP date, becomes the exact delay
//     before the next attempt (a date in the past: 0); an unparsable one is ignored and the backoff applies.
//   - any other status not expected (other 4xx; 1xx, 2xx or 3xx outside expect): `permanent`. Rules can still
//     retry them, for example to poll until a 202 becomes a 200.
//   - network errors (connection refused or reset, DNS failure, TLS error): `transient`.
//   - the step's timeout, or the client's own timeout: `timeout`.
//   - a missing or malformed url, method, header or expect: `permanent`, naming the field.
//
// # sql
//
// Registered only when Options.Pool is set. Runs one statement on that pool. Input:
//
//	{"query": "UPDATE app.jobs SET state = $1 WHERE id = $2 RETURNING id", "args": ["done", 42]}
//
// Arguments are sent in PostgreSQL's text format and converted by the server to the parameter's type: strings
// as they are, numbers exactly as written, booleans as true and false, null as NULL, objects and arrays as their
// JSON text (for json and jsonb parameters; for a SQL array pass a literal such as "{1,2}"). Cast a placeholder
// whose type PostgreSQL cannot infer ($1::int). The statement runs in a transaction of its own (autocommit);
// only one statement is allowed.
//
// Output: {"rows": [{"column": value, …}, …], "rows_affected": N}. rows_affected is the command tag's count
// (rows returned, inserted, updated or deleted). Values are converted to JSON: numbers as numbers (numeric
// exactly), json and jsonb as JSON, timestamps in RFC 3339, uuids and intervals as text, bytea in base64, NaN and
// infinities as strings. Two columns with the same name keep the last. Every returned row is in the output:
// bound the result with LIMIT.
//
// Failures are classified by SQLSTATE (*pgconn.PgError), never by message, with the SQLSTATE in Code:
//   - 40001 serialization_failure, 40P01 deadlock_detected, 55P03 lock_not_available, 57014 query_canceled
//     (statement_timeout): `transient`.
//   - connection errors (class 08, or no SQLSTATE at all: the connection could not be made or broke): `transient`.
//     pgx also refuses some calls before sending them, without a SQLSTATE (a number of args that does not match
//     the placeholders): these are `transient` too, and fail again on every attempt.
//   - the step's timeout: `timeout`.
//   - every other SQLSTATE (syntax error 42601, unique violation 23505, bad argument text 22P02, …): `permanent`.
//
// # exec
//
// Runs a program on the scheduler's host, with the scheduler's user and privileges. Disabled unless
// Options.AllowExec (the scheduler's --allow-exec flag): while disabled, every attempt fails `permanent` with
// Code "exec_disabled" and a message saying how to enable it. Input:
//
//	{"command": ["/usr/bin/make", "deploy"], "dir": "/srv/app", "env": {"STAGE": "prod"}, "stdin": "…"}
//
// command is required and runs without a shell (use ["/bin/sh", "-c", "…"] for one); dir defaults to the
// scheduler's working directory; env is added to the scheduler's environment, overriding variables of the same
// name; stdin defaults to empty. The command runs in a process group of its own, killed as a whole (SIGKILL)
// when the step's timeout expires or the daemon shuts down. On Linux it also dies with the daemon when the daemon
// is killed (SIGKILL, the OOM killer), its process group included, so that the step's retry never overlaps it:
// the command has the parent-death signal SIGKILL, and a watchdog process (this program's own binary re-executed
// as "stepready-exec-watchdog", see exec_linux.go) kills the group when the daemon's end of a pipe closes. A
// process that leaves the group (setsid) is not followed. Elsewhere, a killed daemon leaves the command running.
//
// Output: {"stdout": "…", "stderr": "…", "exit_code": 0}; each stream keeps its first MaxExecOutputBytes
// (10 MiB), as text the step's output can hold: invalid UTF-8 and NUL bytes (find -print0, a binary) become
// U+FFFD, since jsonb cannot store them. Encode binary output (base64) to keep it.
//
// Failures:
//   - a non-zero exit status: `transient`, Code the exit status ("3"; "-1" when killed by a signal), the end
//     of stderr in the message. Use rules (outcome.error.code) to treat particular statuses differently.
//   - the program is not found or not executable, or dir does not exist: `permanent`.
//   - the step's timeout: `timeout`.
//   - an empty command, or NUL bytes in command, dir or env: `permanent`, naming the field.
package builtin
