// Package readiness finds work: it claims ready steps with stepready.claim_ready_steps and hands them to a
// Dispatcher, waking on LISTEN/NOTIFY (channel stepready_ready), on a timer set to the earliest future
// next_attempt_at the database knows of, and on a fallback poll interval. (Reaping the leases of dead workers is
// a maintenance service: internal/maintenance.)
//
// Lifecycle of a Poller:
//
//	Run(ctx) ──► claim while capacity and ready steps remain ──► wait for: notification | due timer |
//	   ▲                                                           poll tick | capacity freed | ctx done
//	   └───────────────────────────────────────────────────────────────┘                          │
//	                                                                                      return nil
//
// Readiness itself is decided by SQL; nothing here re-derives it. Several pollers on one database are safe:
// claims use FOR UPDATE SKIP LOCKED and every attempt start is fenced by start_step.
package readiness
