// Package readiness is how stepready decides that a step may run and finds the steps that may: the SQL functions
// step_readiness, task_execution_context, claim_ready_steps and next_claim_at (docs/state-machine.md, functions.md),
// and the River job that carries a claimed step (StepJobArgs).
//
// Readiness itself is decided by SQL, with the database's clock; nothing in Go re-derives it. The daemon's
// claim loop (internal/dispatch) claims ready steps in batches sized to its free capacity and hands them to a
// dispatcher, waking on LISTEN/NOTIFY (channel stepready_ready), on a timer set to the earliest future
// next_attempt_at, and on a fallback poll interval:
//
//	Run(ctx) ──► claim while capacity and ready steps remain ──► wait for: notification | due timer |
//	   ▲                                                           poll tick | capacity freed | ctx done
//	   └───────────────────────────────────────────────────────────────┘                          │
//	                                                                                      return nil
//
// Several daemons on one database are safe: claims use FOR UPDATE SKIP LOCKED and every attempt start is fenced
// by start_step. Reaping the leases of dead workers is a maintenance service (internal/maintenance).
package readiness
