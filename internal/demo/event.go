package demo

import (
	"fmt"
	"strings"
	"time"
)

// event is one row of stepready.step_events with its task and step names.
type event struct {
	ID        int64
	At        time.Time
	TaskID    int64
	Task      string
	Step      *string // nil for task-level (operator) events
	Attempt   *int
	Iteration *int
	Event     string
	ToState   *string
	Details   details
}

// details holds the fields of step_events.details that the account shows (see sql/080_failure.sql and
// sql/070_attempts.sql for what each event records).
type details struct {
	Class string `json:"class"`
	Error struct {
		Message string `json:"message"`
	} `json:"error"`
	DelayMS     *int64 `json:"delay_ms"`
	Reason      string `json:"reason"`
	OnExhausted string `json:"on_exhausted"`
	Ancestor    string `json:"ancestor"`
	Worker      string `json:"worker"`
	LeaseOwner  string `json:"lease_owner"`
	// Signals and waits (SPEC §20, sql/059_signals.sql).
	Signal    string     `json:"signal"`
	SignalID  int64      `json:"signal_id"`
	Buffered  bool       `json:"buffered"`
	Actor     string     `json:"actor"`
	Until     *time.Time `json:"until"`
	TimeoutMS *int64     `json:"timeout_ms"`
	OnTimeout string     `json:"on_timeout"`
	TimedOut  bool       `json:"timed_out"`
}

// describe returns the text of the event's line, or false for events the account leaves out because another
// line says the same (retry.scheduled repeats attempt.failed, attempt.succeeded precedes step.completed) or
// because they are bookkeeping (step.enqueued).
func (e event) describe() (string, bool) {
	attempt := 0
	if e.Attempt != nil {
		attempt = *e.Attempt
	}
	to := ""
	if e.ToState != nil {
		to = *e.ToState
	}
	d := e.Details
	switch e.Event {
	case "step.enqueued", "retry.scheduled", "attempt.succeeded":
		return "", false
	case "attempt.started":
		s := fmt.Sprintf("attempt %d started", attempt)
		if e.Iteration != nil && *e.Iteration > 0 {
			s += fmt.Sprintf(" (iteration %d)", *e.Iteration)
		}
		return s, true
	case "attempt.failed":
		s := fmt.Sprintf("attempt %d failed (%s: %s)", attempt, d.Class, truncate(d.Error.Message, maxMessage))
		switch {
		case to == "waiting_for_retry" && d.DelayMS != nil:
			s += fmt.Sprintf(" — retry in %d ms", *d.DelayMS)
		case d.Reason != "":
			s += " — " + words(d.Reason)
		}
		return s, true
	case "step.failed":
		if to == "skipped" {
			return "", false // step.skipped follows with the reason
		}
		return "failed — the task is in error", true
	case "step.skipped":
		switch {
		case d.Reason == "ancestor_failed" && d.Ancestor != "":
			return fmt.Sprintf("skipped (%s was skipped)", d.Ancestor), true
		case d.Reason != "":
			return fmt.Sprintf("skipped (%s; on_exhausted: skip)", words(d.Reason)), true
		}
		return "skipped", true
	case "step.completed":
		switch {
		case d.Reason == "max_iterations":
			return "completed (max_iterations reached)", true
		case d.TimedOut:
			return "completed without its signal (on_timeout: continue, output null)", true
		case d.Signal != "":
			return fmt.Sprintf("completed by signal %s (#%d)", d.Signal, d.SignalID), true
		}
		return "completed", true
	case "wait.started":
		switch {
		case d.Signal != "" && d.Until != nil:
			return fmt.Sprintf("waiting for signal %s (until %s)", d.Signal, d.Until.Format(time.RFC3339)), true
		case d.Signal != "":
			return fmt.Sprintf("waiting for signal %s", d.Signal), true
		case d.Until != nil:
			return fmt.Sprintf("sleeping until %s", d.Until.Format(time.RFC3339)), true
		}
		return "waiting", true
	case "signal.received":
		s := fmt.Sprintf("signal %s (#%d) received", d.Signal, d.SignalID)
		if d.Actor != "" {
			s += " from " + d.Actor
		}
		if d.Buffered {
			s += " — buffered until its step waits"
		}
		return s, true
	case "signal.delivered":
		return "", false // step.completed follows, naming the signal
	case "wait.timed_out":
		ms := int64(0)
		if d.TimeoutMS != nil {
			ms = *d.TimeoutMS
		}
		return fmt.Sprintf("no signal %s within %d ms (on_timeout: %s)", d.Signal, ms, d.OnTimeout), true
	case "iteration.continued":
		if d.DelayMS != nil {
			return fmt.Sprintf("iteration done — next in %d ms", *d.DelayMS), true
		}
		return "iteration done", true
	case "step.released":
		return "handed back uncharged", true
	case "lease.expired":
		return fmt.Sprintf("lease of %s expired", d.LeaseOwner), true
	case "step.cancelled":
		return "cancelled", true
	case "step.resolved":
		return "resolved manually", true
	}
	if op, ok := strings.CutPrefix(e.Event, "operator."); ok {
		return "operator: " + words(op), true
	}
	if to != "" {
		return fmt.Sprintf("%s → %s", e.Event, to), true
	}
	return e.Event, true
}

// truncate shortens s to at most n runes, marking the cut.
func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ") // one line
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
