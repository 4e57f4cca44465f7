// Package steps runs step attempts: the handler API (Handler, Step, the outcome constructors Fail, FailAfter,
// Permanent and Repeat), the handler Registry, and the built-in handlers.
//
// A handler receives one attempt of one step and returns an output or an error; the worker machinery (claim,
// start, heartbeat, record) turns that into the SQL calls of the stepready schema. Rules about readiness and
// retries live in SQL: a handler only classifies what happened.
package steps
