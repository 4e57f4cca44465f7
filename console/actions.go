package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/readmodel"
	"github.com/stepready/stepready/internal/store"
)

// Actions (SPEC §16): task cancel, pause, resume and reset, step retry and resolve, each through the SQL operator
// function of SPEC §9 with details.actor = "ui". They exist only when the console is started with actions
// allowed and a token; a browser signs in with the token (form or bearer header) and gets an HttpOnly,
// SameSite=Strict session cookie; every form carries a CSRF token bound to that session.

// ErrNoToken is returned by New when actions are allowed without a token.
var ErrNoToken = errors.New("console: actions need a token (--ui-token or STEPREADY_UI_TOKEN)")

const (
	sessionCookie = "stepready_session"
	flashCookie   = "stepready_flash"
)

// auth holds the token's derived secrets. Sessions are an HMAC of the token under a key drawn at start: the
// cookie never holds the token, and a restart signs everyone out.
type auth struct {
	token   []byte
	session string // the session cookie's value
	csrf    string // the CSRF token of that session
}

func newAuth(token string) (*auth, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("console: session key: %w", err)
	}
	mac := func(parts ...string) string {
		h := hmac.New(sha256.New, key)
		for _, p := range parts {
			h.Write([]byte(p))
			h.Write([]byte{0})
		}
		return hex.EncodeToString(h.Sum(nil))
	}
	s := mac("session", token)
	return &auth{token: []byte(token), session: s, csrf: mac("csrf", s)}, nil
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// who tells how a request is authenticated: by a bearer token (no CSRF needed: a browser never sends one on its
// own) or by the session cookie.
func (a *auth) who(r *http.Request) (bearer, session bool) {
	if a == nil {
		return false, false
	}
	if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") {
		if subtle.ConstantTimeCompare([]byte(strings.TrimPrefix(h, "Bearer ")), a.token) == 1 {
			return true, false
		}
	}
	if ck, err := r.Cookie(sessionCookie); err == nil && equal(ck.Value, a.session) {
		return false, true
	}
	return false, false
}

// setSession gives the browser the session cookie.
func (a *auth) setSession(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: a.session, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// actionsView is what the pages need to draw the actions: nothing unless signed in.
type actionsView struct {
	Enabled  bool   // the console allows actions (a sign-in link is shown when not signed in)
	SignedIn bool   // forms are drawn
	CSRF     string // the forms' hidden csrf field
}

func (c *Console) actionsView(r *http.Request) actionsView {
	if c.auth == nil {
		return actionsView{}
	}
	bearer, session := c.auth.who(r)
	return actionsView{Enabled: true, SignedIn: bearer || session, CSRF: c.auth.csrf}
}

// flash is a one-time message shown on the next page: the outcome of an action.
type flash struct {
	Error   bool   `json:"error,omitempty"`
	Message string `json:"message"`
}

func setFlash(w http.ResponseWriter, f flash) {
	b, _ := json.Marshal(f)
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: base64.RawURLEncoding.EncodeToString(b), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: 60})
}

// takeFlash reads and clears the flash message.
func takeFlash(w http.ResponseWriter, r *http.Request) *flash {
	ck, err := r.Cookie(flashCookie)
	if err != nil {
		return nil
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	b, err := base64.RawURLEncoding.DecodeString(ck.Value)
	if err != nil {
		return nil
	}
	var f flash
	if json.Unmarshal(b, &f) != nil || f.Message == "" {
		return nil
	}
	return &f
}

// localPath is p when it is a path of this console, else "/": the sign-in form's next= must never send the browser
// elsewhere (an open redirect). A path qualifies when it starts with exactly one "/", parses with no scheme, host
// or user, and holds no backslash, control character or invalid UTF-8, neither as given nor percent-decoded:
// browsers drop tabs and newlines from a Location and read "\" as "/", so "/\t/evil.example" or "/\\evil" would
// become "//evil.example", another origin.
func localPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || !redirectSafe(p) {
		return "/"
	}
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return "/"
	}
	if !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") || !redirectSafe(u.Path) {
		return "/"
	}
	return p
}

// redirectSafe reports whether s holds no backslash, no control character (C0, DEL, C1) and only valid UTF-8.
func redirectSafe(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r == '\\' || r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return false
		}
	}
	return true
}

type loginData struct {
	Next  string
	Error string
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, "login", "Sign in", "", loginData{Next: localPath(r.URL.Query().Get("next"))})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	next := localPath(r.PostFormValue("next"))
	if subtle.ConstantTimeCompare([]byte(r.PostFormValue("token")), c.auth.token) != 1 {
		w.WriteHeader(http.StatusUnauthorized)
		c.render(w, r, "login", "Sign in", "", loginData{Next: next, Error: "That token is not the console's."})
		return
	}
	c.auth.setSession(w, r)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if !c.authorized(w, r) {
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// authorized answers 403 unless the request is signed in (bearer, or session cookie with the CSRF token).
func (c *Console) authorized(w http.ResponseWriter, r *http.Request) bool {
	bearer, session := c.auth.who(r)
	if bearer || (session && equal(r.PostFormValue("csrf"), c.auth.csrf)) {
		return true
	}
	http.Error(w, "forbidden: sign in to act (and send the form's csrf field)", http.StatusForbidden)
	return false
}

// uiActor is what the console's actions record as details.actor of their operator events.
var uiActor = stepready.OperatorOptions{Actor: "ui"}

// An action: the library's operator call and the message of its success.
type action struct {
	call func(ctx context.Context, db stepready.Beginner, id int64, r *http.Request) error
	done string
}

var taskActions = map[string]action{
	"cancel": {func(ctx context.Context, db stepready.Beginner, id int64, _ *http.Request) error {
		_, err := stepready.CancelTask(ctx, db, id, "cancelled from the web console", uiActor)
		return err
	}, "task %d cancelled"},
	"pause": {func(ctx context.Context, db stepready.Beginner, id int64, _ *http.Request) error {
		_, err := stepready.PauseTask(ctx, db, id, uiActor)
		return err
	}, "task %d paused"},
	"resume": {func(ctx context.Context, db stepready.Beginner, id int64, _ *http.Request) error {
		_, err := stepready.ResumeTask(ctx, db, id, uiActor)
		return err
	}, "task %d resumed"},
	"reset": {func(ctx context.Context, db stepready.Beginner, id int64, _ *http.Request) error {
		_, err := stepready.ResetTask(ctx, db, id, uiActor)
		return err
	}, "task %d reset: its failed, skipped and cancelled steps run again"},
}

var stepActions = map[string]action{
	"retry": {func(ctx context.Context, db stepready.Beginner, id int64, _ *http.Request) error {
		_, err := stepready.RetryStepNow(ctx, db, id, uiActor)
		return err
	}, "step %d will be retried now"},
	"resolve": {func(ctx context.Context, db stepready.Beginner, id int64, r *http.Request) error {
		out := json.RawMessage(strings.TrimSpace(r.PostFormValue("output")))
		_, err := stepready.ResolveStep(ctx, db, id, out, uiActor)
		return err
	}, "step %d resolved by hand"},
}

func (c *Console) taskAction(w http.ResponseWriter, r *http.Request) {
	id, ok := c.pathID(w, r, "id")
	if !ok {
		return
	}
	a, known := taskActions[r.PathValue("action")]
	if !known {
		http.NotFound(w, r)
		return
	}
	if !c.authorized(w, r) {
		return
	}
	c.runAction(w, r, fmt.Sprintf("/tasks/%d", id), fmt.Sprintf(a.done, id), a, id)
}

func (c *Console) stepAction(w http.ResponseWriter, r *http.Request) {
	taskID, ok := c.pathID(w, r, "id")
	if !ok {
		return
	}
	stepID, ok := c.pathID(w, r, "step")
	if !ok {
		return
	}
	a, known := stepActions[r.PathValue("action")]
	if !known {
		http.NotFound(w, r)
		return
	}
	if !c.authorized(w, r) {
		return
	}
	// The step must be the task's: the operator functions take the step's id alone, so without this check
	// /tasks/1/steps/2/resolve would act on step 2 whatever its task.
	if !c.stepOfTask(w, r, taskID, stepID) {
		return
	}
	back := fmt.Sprintf("/tasks/%d/steps/%d", taskID, stepID)
	if r.PathValue("action") == "resolve" && !json.Valid([]byte(strings.TrimSpace(r.PostFormValue("output")))) {
		setFlash(w, flash{Error: true, Message: "the output must be a JSON document (for example {\"ok\": true} or null)"})
		http.Redirect(w, r, back, http.StatusSeeOther)
		return
	}
	c.runAction(w, r, back, fmt.Sprintf(a.done, stepID), a, stepID)
}

// runAction runs the library's operator action a on id (actor "ui"), and sends the browser back to back with the
// outcome: a refusal of the database is a message, not an error page.
func (c *Console) runAction(w http.ResponseWriter, r *http.Request, back, done string, a action, id int64) {
	c.answerAction(w, r, back, done, a.call(r.Context(), c.pool, id, r))
}

// answerAction sends the browser back to back with the outcome err of an action (nil: done): a refusal of the
// database is a message, not an error page.
func (c *Console) answerAction(w http.ResponseWriter, r *http.Request, back, done string, err error) {
	err = store.NameGrantingRoles(r.Context(), c.pool, err)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		c.log.Info("console: action", "what", done)
		setFlash(w, flash{Message: done})
	case errors.Is(err, stepready.ErrSignalRefused):
		setFlash(w, flash{Error: true, Message: "refused: " + err.Error()})
	case errors.Is(err, stepready.ErrNotFound):
		setFlash(w, flash{Error: true, Message: "refused: " + err.Error()})
		back = "/" // the task or step is gone: its page would be a 404
	case errors.As(err, &pgErr) && refusal(pgErr.Code):
		msg := pgErr.Message
		if pgErr.Code == "42501" {
			msg = err.Error() // with the roles that grant it
		}
		if pgErr.Detail != "" {
			msg += " (" + pgErr.Detail + ")"
		}
		setFlash(w, flash{Error: true, Message: "refused: " + msg})
		if pgErr.Code == "P0002" {
			back = "/" // the task or step is gone: its page would be a 404
		}
	default:
		if errors.Is(err, context.Canceled) {
			return
		}
		c.log.Error("console: action failed", "what", done, "err", err)
		setFlash(w, flash{Error: true, Message: "the action failed (see the console's log)"})
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// refusal says whether a SQLSTATE is the database saying no to what was asked, whose message the operator should
// read: an impossible transition or a refused signal (55000), an unknown task or step (P0002), a check (23514), a
// missing privilege (42501, with the roles that grant it: the console's own role may not act), a value over a
// limit (54000: a signal's payload over max_output_bytes), or any data exception
// (class 22: a bad argument, 22023 and 22P02, or a value PostgreSQL cannot store, such as a resolve output holding
// \u0000, 22P05, or a number out of range, 22003).
func refusal(code string) bool {
	switch code {
	case "55000", "P0002", "23514", "42501", "54000":
		return true
	}
	return strings.HasPrefix(code, "22")
}

// stepOfTask reports whether step stepID is task taskID's; when it is not (or cannot be read) it has answered: 404
// for a step of another task or none, the read's error otherwise. The operator functions take a step's id alone,
// so every step action under /tasks/{id} checks the pair first.
func (c *Console) stepOfTask(w http.ResponseWriter, r *http.Request, taskID, stepID int64) bool {
	switch owner, err := readmodel.StepTask(r.Context(), c.pool, stepID); {
	case errors.Is(err, readmodel.ErrNotFound) || (err == nil && owner != taskID):
		http.Error(w, fmt.Sprintf("task %d has no step %d", taskID, stepID), http.StatusNotFound)
		return false
	case err != nil:
		c.fail(w, "step", err)
		return false
	}
	return true
}
