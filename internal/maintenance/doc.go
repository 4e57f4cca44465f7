// Package maintenance runs stepready's maintenance services: the work that keeps the database healthy and the
// backlog moving but is no step's own. One Maintainer starts them all, staggered, and stops them together:
//
//   - LeaseReaper: attempts whose worker died (lease expired) are failed as stalled or handed back.
//   - TaskPruner: finished tasks past their retention are deleted with their steps and events (SPEC §13).
//   - FlowKeyPruner: the flow_state rows of idle flow-control keys are deleted (SPEC §14).
//   - ScheduleEnqueuer: due schedules fire, one task per fire time (SPEC §15).
//   - BacklogExporter: the backlog (queue_stats) and what flow control holds back become Prometheus gauges.
//
// # One shape for every service
//
// Every service has a Config with named defaults (zero takes the default), validated when the service is built;
// a negative Interval (Off) turns it off. A service works in rounds. Each round starts with an election: a
// transaction that takes the service's transaction-scoped advisory lock with pg_try_advisory_xact_lock. An
// instance that does not get it skips the round, so however many daemons run, one does each round; the lock
// keys are written once, in elect.go. A service that deletes or reaps rows works in batches of Config.Batch
// until a batch comes back short, each batch in its own transaction under Config.Timeout with a short jittered
// pause between batches: a large backlog is drained in one round without holding locks for long. Its SQL goes
// through internal/store and its metrics through internal/metrics.
//
// # Lifecycle
//
//	New ──Start──▶ running ──Stop (or the Start context ends)──▶ stopped (Stopped() closed)
//
// Stop is idempotent and waits for every service's round in progress to end; a service's round is never cut
// off in the middle of a batch by Stop except through its context, and every batch is a transaction of its own,
// so a stop loses nothing.
package maintenance
