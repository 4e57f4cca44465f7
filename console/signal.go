package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/metrics"
)

// sendSignalForm is POST /tasks/{id}/signal, the step page's "Send signal" form (SPEC §20): it sends the signal
// name with the payload (JSON) and the optional idempotency key to the task through stepready.SendSignal with
// actor "ui", and sends the browser back to the step it came from (the form's step field, a step of that task)
// with the outcome at the top of the page. A payload that is not JSON is refused before anything is sent.
func (c *Console) sendSignalForm(w http.ResponseWriter, r *http.Request) {
	taskID, ok := c.pathID(w, r, "id")
	if !ok {
		return
	}
	if !c.authorized(w, r) {
		return
	}
	back := fmt.Sprintf("/tasks/%d", taskID)
	if v := r.PostFormValue("step"); v != "" {
		// The step must be the task's: it only chooses the page to go back to.
		stepID, err := strconv.ParseInt(v, 10, 64)
		if err != nil || stepID <= 0 {
			http.Error(w, "step: want a step id", http.StatusBadRequest)
			return
		}
		if !c.stepOfTask(w, r, taskID, stepID) {
			return
		}
		back = fmt.Sprintf("/tasks/%d/steps/%d", taskID, stepID)
	}
	refuse := func(msg string) {
		setFlash(w, flash{Error: true, Message: msg})
		http.Redirect(w, r, back, http.StatusSeeOther)
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	if name == "" {
		refuse("refused: the signal needs a name")
		return
	}
	payload := json.RawMessage(strings.TrimSpace(r.PostFormValue("payload")))
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	if !json.Valid(payload) {
		c.sends.Observe("ui", metrics.SendInvalid)
		refuse("refused: the payload must be a JSON document (for example {\"approved\": true})")
		return
	}
	opts := stepready.SignalOptions{Actor: "ui", IdempotencyKey: strings.TrimSpace(r.PostFormValue("idempotency_key"))}
	id, err := stepready.SendSignal(r.Context(), c.pool, taskID, name, payload, opts)
	c.sends.Observe("ui", sendOutcome(err))
	c.answerAction(w, r, back, fmt.Sprintf("signal %q sent to task %d (signal %d)", name, taskID, id), err)
}

// sendOutcome classifies the answer to a signal sent through the console for stepready_signal_sends_total.
func sendOutcome(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return metrics.SendSent
	case errors.Is(err, stepready.ErrSignalRefused) || (errors.As(err, &pgErr) && pgErr.Code == "55000"):
		return metrics.SendRefused
	case errors.Is(err, stepready.ErrNotFound):
		return metrics.SendNotFound
	case errors.Is(err, stepready.ErrInvalidSignal) ||
		(errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || pgErr.Code == "54000")):
		return metrics.SendInvalid
	}
	return metrics.SendError
}
