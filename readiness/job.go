package readiness

import "time"

// JobKind is the River job kind of a claimed step (river_job.kind), for River's own tools and queries.
const JobKind = "stepready_step"

// StepJobArgs is the River job of one claimed step (River dispatch). River only transports it: the job always has
// MaxAttempts 1 and its worker always succeeds, because stepready's SQL is the only retry authority; the
// attempt's outcome is recorded in stepready.steps and step_events, never as a River retry. The job carries the
// claim's ids, not the step's input: the worker reads the current input, context and rules when it starts the
// attempt (start_steps), so nothing large is copied into River's tables.
type StepJobArgs struct {
	// Step is the claim row.
	Step Claim `json:"step"`
	// ClaimedAt is when the claim committed (for the claim-to-start latency).
	ClaimedAt time.Time `json:"claimed_at"`
}

// Kind implements River's JobArgs.
func (StepJobArgs) Kind() string { return JobKind }

// Claim is one claimed step, as claim_ready_steps returns it (docs/functions.md) and a River job carries it.
type Claim struct {
	StepID  int64  `json:"step_id"`
	TaskID  int64  `json:"task_id"`
	Name    string `json:"name"`
	Handler string `json:"handler"`
	// Attempts is the number of attempts the step had made when it was claimed.
	Attempts int `json:"attempts"`
	// TimeoutMS is the step's per-attempt timeout (nil: the daemon's default).
	TimeoutMS *int64 `json:"timeout_ms,omitempty"`
	Queue     string `json:"queue"`
}
