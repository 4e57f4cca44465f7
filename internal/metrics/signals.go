package metrics

import "github.com/prometheus/client_golang/prometheus"

// SignalSends counts the signals a process sent on behalf of others (the console's form and POST /api/signals),
// by how the database answered. A refused signal leaves nothing in the database (nothing is kept that nobody would
// read), so the process that forwarded it is the only place a refusal can be counted. Safe on a nil receiver.
type SignalSends struct {
	sends *prometheus.CounterVec
}

// Outcomes of a send, the values of the outcome label.
const (
	SendSent     = "sent"      // the database took it (delivered to a waiting step or buffered)
	SendRefused  = "refused"   // a finished task, or no unfinished step waits for the name (SQLSTATE 55000)
	SendNotFound = "not_found" // no such task (P0002)
	SendInvalid  = "invalid"   // a bad name, payload or body, or a payload over the output cap
	SendError    = "error"     // anything else (the database unreachable, a missing privilege)
)

// NewSignalSends creates stepready_signal_sends_total and registers it with reg (nil: not registered anywhere).
func NewSignalSends(reg prometheus.Registerer) *SignalSends {
	s := &SignalSends{sends: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stepready_signal_sends_total",
		Help: "Signals sent through this process (via: api, ui) by outcome: sent, refused (a finished task, or no " +
			"step waits for the name), not_found (no such task), invalid (a bad name, payload or body), error."},
		[]string{"via", "outcome"})}
	if reg != nil {
		reg.MustRegister(s.sends)
	}
	return s
}

// Observe counts one send through via (api, ui) with its outcome (one of the Send* constants).
func (s *SignalSends) Observe(via, outcome string) {
	if s == nil {
		return
	}
	s.sends.WithLabelValues(via, outcome).Inc()
}
