package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/metrics"
	"github.com/stepready/stepready/internal/store"
)

// The JSON API (SPEC §20): POST /api/signals sends a signal to a task, for webhooks and scripts. It exists only
// when actions are allowed (a token is set), and answers only requests that carry the token as
// `Authorization: Bearer TOKEN` (a webhook has no session; a browser's cookie is not enough, so no page of
// another site can make a signed-in browser send one). Every answer is JSON; an error names the field at fault.

// apiBodyMax bounds a request body of the API: a signal's payload is a step's output, which the database caps
// (settings.max_output_bytes, 1 MiB unless changed); the rest of the body is small.
const apiBodyMax = 4 << 20

// signalRequest is the body of POST /api/signals: the task (by id or by its idempotency key, exactly one), the
// signal's name, its payload (any JSON value; absent: {}) and an optional idempotency key (a repeat with the same
// key answers the first signal's id and adds nothing).
type signalRequest struct {
	TaskID         *int64          `json:"task_id"`
	TaskKey        *string         `json:"task_key"`
	Name           string          `json:"name"`
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey *string         `json:"idempotency_key"`
}

// signalResponse is the answer of a signal sent: its id (the first signal's with a repeated idempotency key).
type signalResponse struct {
	ID int64 `json:"id"`
}

// apiError is every error answer of the API: what went wrong, and the request field it is about ("" when it is
// about no field, such as a database that cannot be reached).
type apiError struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

// writeJSON answers status with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func apiFail(w http.ResponseWriter, status int, field, format string, args ...any) {
	writeJSON(w, status, apiError{Error: fmt.Sprintf(format, args...), Field: field})
}

// sendSignalAPI is POST /api/signals.
func (c *Console) sendSignalAPI(w http.ResponseWriter, r *http.Request) {
	if bearer, _ := c.auth.who(r); !bearer {
		w.Header().Set("WWW-Authenticate", `Bearer realm="stepready"`)
		apiFail(w, http.StatusUnauthorized, "authorization", "send the console's token as Authorization: Bearer TOKEN")
		return
	}
	req, field, err := decodeSignalRequest(http.MaxBytesReader(w, r.Body, apiBodyMax))
	if err != nil {
		status := http.StatusBadRequest
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			status, field = http.StatusRequestEntityTooLarge, "body"
			err = fmt.Errorf("the body is over %d bytes", apiBodyMax)
		}
		c.sends.Observe("api", metrics.SendInvalid)
		apiFail(w, status, field, "%v", err)
		return
	}
	opts := stepready.SignalOptions{Actor: "api"}
	if req.IdempotencyKey != nil {
		opts.IdempotencyKey = *req.IdempotencyKey
	}
	var id int64
	taskField := "task_id"
	if req.TaskID != nil {
		id, err = stepready.SendSignal(r.Context(), c.pool, *req.TaskID, req.Name, req.Payload, opts)
	} else {
		taskField = "task_key"
		id, err = stepready.SendSignalToKey(r.Context(), c.pool, *req.TaskKey, req.Name, req.Payload, opts)
	}
	c.sends.Observe("api", sendOutcome(err))
	if err != nil {
		c.signalRefused(r.Context(), w, err, taskField)
		return
	}
	c.log.Info("console: signal sent", "id", id, "name", req.Name, "via", "api")
	writeJSON(w, http.StatusCreated, signalResponse{ID: id})
}

// decodeSignalRequest reads and checks a body of POST /api/signals; on error it returns the field at fault.
func decodeSignalRequest(body io.Reader) (signalRequest, string, error) {
	var req signalRequest
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var typeErr *json.UnmarshalTypeError
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return req, "body", err
		case errors.As(err, &typeErr) && typeErr.Field != "":
			return req, typeErr.Field, fmt.Errorf("%s: want %s, got a JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return req, name, fmt.Errorf("unknown field %q (want task_id or task_key, name, payload, idempotency_key)", name)
		case errors.Is(err, io.EOF):
			return req, "body", errors.New("the body is empty: want a JSON object with task_id or task_key, and name")
		}
		return req, "body", fmt.Errorf("the body is not a JSON object: %w", err)
	}
	if dec.More() {
		return req, "body", errors.New("the body holds more than one JSON value")
	}
	switch {
	case req.TaskID != nil && req.TaskKey != nil:
		return req, "task_id", errors.New("task_id and task_key: give one of them, not both")
	case req.TaskID == nil && req.TaskKey == nil:
		return req, "task_id", errors.New("task_id or task_key is required")
	case req.TaskKey != nil && *req.TaskKey == "":
		return req, "task_key", errors.New("task_key is empty")
	case strings.TrimSpace(req.Name) == "":
		return req, "name", errors.New("name is required")
	case req.IdempotencyKey != nil && *req.IdempotencyKey == "":
		return req, "idempotency_key", errors.New("idempotency_key is empty (leave it out for none)")
	}
	if len(bytes.TrimSpace(req.Payload)) == 0 {
		req.Payload = json.RawMessage(`{}`)
	}
	return req, "", nil
}

// signalRefused answers the error of a signal the library did not send: unknown task 404, refused 409 (a
// finished task, no step waits for that name), a payload over max_output_bytes 413, a value the database cannot
// store 400, a missing privilege 403;
// anything else is logged and answered 500 without its details.
func (c *Console) signalRefused(ctx context.Context, w http.ResponseWriter, err error, taskField string) {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, stepready.ErrNotFound):
		apiFail(w, http.StatusNotFound, taskField, "%v", err)
	case errors.Is(err, stepready.ErrSignalRefused) || (errors.As(err, &pgErr) && pgErr.Code == "55000"):
		apiFail(w, http.StatusConflict, "name", "%v", err)
	case errors.As(err, &pgErr) && pgErr.Code == "54000":
		apiFail(w, http.StatusRequestEntityTooLarge, "payload", "%s", pgErr.Message)
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		apiFail(w, http.StatusForbidden, "", "%v", store.NameGrantingRoles(ctx, c.pool, err))
	case errors.As(err, &pgErr) && pgErr.Code == "22023":
		// The arguments send_signal checks that decodeSignalRequest has not: a name over 255 characters.
		apiFail(w, http.StatusBadRequest, "name", "%s", pgErr.Message)
	case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22"):
		msg := pgErr.Message
		if pgErr.Detail != "" {
			msg += " (" + pgErr.Detail + ")"
		}
		apiFail(w, http.StatusBadRequest, "payload", "%s", msg)
	case errors.Is(err, context.Canceled):
	default:
		c.log.Error("console: signal failed", "err", err)
		apiFail(w, http.StatusInternalServerError, "", "the signal was not sent (see the console's log)")
	}
}
