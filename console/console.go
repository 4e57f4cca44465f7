// Package console is stepready's web console (SPEC §16): server-rendered pages over the database for operators,
// served by `scheduler ui`, `scheduler run --ui-addr` and `scheduler demo`.
//
// Every page is HTML rendered by html/template (so every task name, context, input, output and error message
// is escaped) from the read model (internal/readmodel, shared with the CLI); the scheduling rules are never re-derived in Go (a step's
// reason comes from stepready.explain_task, the backlog from stepready.queue_stats). Assets are embedded; the
// pages read correctly with JavaScript off, and a small script swaps the task page's content when its task has
// a new event (server-sent events on /events, fed by one poller per process, see live.go). The console is
// read-only unless started with actions and a token (actions.go).
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepready/stepready/internal/metrics"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// DefaultAddr is the address `scheduler ui` listens on by default: loopback only.
const DefaultAddr = "127.0.0.1:8080"

// pageSize is the number of tasks (and events) per page.
const pageSize = 50

// estimateThreshold is the planner's task count above which the counts per status are planner estimates
// (labelled as such) instead of exact counts: an exact count reads every task.
const estimateThreshold = 100_000

// csp forbids inline scripts and styles and every origin but the console's own.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Options configure a console.
type Options struct {
	// Logger receives the console's errors (nil: slog.Default()).
	Logger *slog.Logger

	// PollInterval is how often the live poller looks for new step events (0: 300 ms).
	PollInterval time.Duration

	// AllowActions serves the operator actions (task cancel, pause, resume, reset; step retry, resolve; sending a
	// signal) to browsers signed in with Token, and the JSON API (POST /api/signals) to requests that carry Token
	// as a bearer token. New refuses AllowActions without a Token.
	AllowActions bool

	// Token signs a browser in (login form or `Authorization: Bearer TOKEN`).
	Token string

	// Registerer receives the console's own collectors (nil: none registered): stepready_signal_sends_total, the
	// signals sent through the form and POST /api/signals by outcome, refusals included (a refused signal leaves
	// nothing in the database to count). `scheduler run` passes the registry of its /metrics.
	Registerer prometheus.Registerer
}

// Console is the console's HTTP handler. Close stops its live poller.
type Console struct {
	pool   *pgxpool.Pool
	log    *slog.Logger
	tmpl   map[string]*template.Template
	mux    *http.ServeMux
	live   *hub
	auth   *auth // nil: read-only
	sends  *metrics.SignalSends
	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	done   chan struct{} // closed when the live poller has returned
}

// New returns the console over pool. The live poller starts at once and runs until Close.
func New(pool *pgxpool.Pool, opts Options) (*Console, error) {
	if pool == nil {
		return nil, errors.New("console: nil pool")
	}
	c := &Console{pool: pool, log: opts.Logger, tmpl: map[string]*template.Template{},
		sends: metrics.NewSignalSends(opts.Registerer)}
	if c.log == nil {
		c.log = slog.Default()
	}
	if opts.AllowActions {
		if opts.Token == "" {
			return nil, ErrNoToken
		}
		a, err := newAuth(opts.Token)
		if err != nil {
			return nil, err
		}
		c.auth = a
	}
	for _, page := range []string{"tasks", "task", "step", "templates", "policies", "schedules", "table", "login",
		"error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html",
			"templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parse template %s: %w", page, err)
		}
		c.tmpl[page] = t
	}
	interval := opts.PollInterval
	if interval <= 0 {
		interval = 300 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.ctx, c.cancel = ctx, cancel
	c.live = newHub(pool, interval, c.log)
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		c.live.run(ctx)
	}()

	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("console: static assets: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /healthz", c.healthz)
	mux.HandleFunc("GET /{$}", c.tasksPage)
	mux.HandleFunc("GET /", c.notFoundPage)
	mux.HandleFunc("GET /tasks/{id}", c.taskPage)
	mux.HandleFunc("GET /tasks/{id}/steps/{step}", c.stepPage)
	mux.HandleFunc("GET /templates", c.templatesPage)
	mux.HandleFunc("GET /policies", c.policiesPage)
	mux.HandleFunc("GET /schedules", c.schedulesPage)
	mux.HandleFunc("GET /flow", c.flowPage)
	mux.HandleFunc("GET /events", c.events)
	if c.auth != nil {
		mux.HandleFunc("GET /login", c.loginPage)
		mux.HandleFunc("POST /login", c.login)
		mux.HandleFunc("POST /logout", c.logout)
		mux.HandleFunc("POST /tasks/{id}/{action}", c.taskAction)
		mux.HandleFunc("POST /tasks/{id}/steps/{step}/{action}", c.stepAction)
		mux.HandleFunc("POST /tasks/{id}/signal", c.sendSignalForm)
		mux.HandleFunc("POST /api/signals", c.sendSignalAPI)
	}
	c.mux = mux
	return c, nil
}

// Close stops the live poller, waits for it to return, and ends every open event stream. Call it before the
// pool closes.
func (c *Console) Close() {
	c.cancel()
	<-c.done
}

// ServeHTTP serves the console, with security headers on every response.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	if bearer, session := c.auth.who(r); bearer && !session {
		c.auth.setSession(w, r) // a browser that sent the token as a header browses on with the cookie
	}
	if err := checkQuery(r.URL.Query()); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// checkQuery refuses query parameters that no page can use and PostgreSQL cannot hold in a text value (a filter
// with NUL or invalid UTF-8 would otherwise reach a query and fail it: an internal error instead of an answer).
func checkQuery(q url.Values) error {
	for _, k := range slices.Sorted(maps.Keys(q)) {
		for _, v := range append([]string{k}, q[k]...) {
			switch {
			case !utf8.ValidString(v):
				return fmt.Errorf("query parameter %q is not valid UTF-8", k)
			case strings.ContainsRune(v, 0):
				return fmt.Errorf("query parameter %q holds a NUL character", k)
			}
		}
	}
	return nil
}

func (c *Console) healthz(w http.ResponseWriter, r *http.Request) {
	if err := c.pool.Ping(r.Context()); err != nil {
		http.Error(w, "database unreachable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}
