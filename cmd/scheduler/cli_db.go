package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/internal/readmodel"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/migrations"
)

// The operator commands (explain, task, step, template, policy) share this plumbing: a database URL, an output
// format, an optional pinned time, and the translation of the database's refusals into plain errors. The
// commands call stepready's SQL functions and print what they return; no rule is re-derived in Go.

// Output formats of --output. table and json are every command's; id (`task create`) prints only the ids, one
// per line, for a script to capture.
const (
	outputTable = "table"
	outputJSON  = "json"
	outputID    = "id"
)

// dbOptions are the flags every database command has.
type dbOptions struct {
	url    string
	output string
	asOf   string
}

// addDBFlags registers --database-url and --output on cmd (persistent: its subcommands inherit them).
func addDBFlags(cmd *cobra.Command, o *dbOptions) {
	cmd.PersistentFlags().StringVar(&o.url, "database-url", "", "PostgreSQL URL of the stepready database")
	setDefaultText(cmd.PersistentFlags(), "database-url", "none")
	cmd.PersistentFlags().StringVarP(&o.output, "output", "o", outputTable,
		"output format: table (for people) or json (stable, for scripts)")
}

// addAsOfFlag registers --as-of on cmd: the time readiness is judged at.
func addAsOfFlag(cmd *cobra.Command, o *dbOptions) {
	cmd.Flags().StringVar(&o.asOf, "as-of", "",
		"judge readiness at this time (RFC 3339, for example 2030-01-01T12:00:00Z) instead of the database's now")
	setDefaultText(cmd.Flags(), "as-of", "database now")
}

// format checks --output: table, json, or one of the extra formats the command offers.
func (o *dbOptions) format(extra ...string) (string, error) {
	if o.output == outputTable || o.output == outputJSON || slices.Contains(extra, o.output) {
		return o.output, nil
	}
	want := strings.Join(append([]string{outputTable}, extra...), ", ")
	return "", usagef("--output %q: want %s or %s", o.output, want, outputJSON)
}

// connect opens one connection to the database named by --database-url (or the environment). It works through
// a transaction pooler such as PgBouncer: it sends no startup parameter of its own (PgBouncer refuses unknown
// ones; the actor of operator events is set in their transaction by the library's operator actions) and prepares no named statement
// (store.UsePoolerQueryMode, unless the URL names default_query_exec_mode): a command runs each statement
// once or twice, so caching them would only cost a round trip.
func (o *dbOptions) connect(ctx context.Context) (*pgx.Conn, error) {
	url, err := databaseURL(o.url)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	store.UsePoolerQueryMode(cfg)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	return conn, nil
}

// withConn validates --output, connects and runs f, closing the connection afterwards.
func (o *dbOptions) withConn(ctx context.Context, f func(conn *pgx.Conn, format string) error) error {
	return o.withConnFormats(ctx, nil, f)
}

// withConnFormats is withConn for a command that offers the extra output formats besides table and json.
func (o *dbOptions) withConnFormats(ctx context.Context, extra []string, f func(conn *pgx.Conn, format string) error) error {
	format, err := o.format(extra...)
	if err != nil {
		return err
	}
	conn, err := o.connect(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if err := checkSchema(ctx, conn); err != nil {
		return err
	}
	// A permission error names the roles that grant what was refused (read after f's transaction ended).
	return dbError(store.NameGrantingRoles(ctx, conn, f(conn, format)))
}

// checkSchema refuses (exit 2) a database whose stepready schema is not this binary's: never migrated, older,
// newer, or dirty (migrations.Check), saying what to do.
func checkSchema(ctx context.Context, q migrations.Querier) error {
	err := migrations.Check(ctx, q)
	if isSchemaMismatch(err) {
		return usageError{err}
	}
	return err
}

// isSchemaMismatch reports whether err is one of migrations.Check's findings (not a failure to read).
func isSchemaMismatch(err error) bool {
	for _, kind := range []error{migrations.ErrNotMigrated, migrations.ErrSchemaOlder, migrations.ErrSchemaNewer,
		migrations.ErrSchemaDirty} {
		if errors.Is(err, kind) {
			return true
		}
	}
	return false
}

// dbNow returns --as-of, or the database's current time when it is not set. Every time printed is relative to
// it, so that a client with a wrong clock still prints the truth.
func (o *dbOptions) dbNow(ctx context.Context, q pgx.Tx) (time.Time, error) {
	at, err := o.asOfTime()
	if err != nil {
		return time.Time{}, err
	}
	return readmodel.Now(ctx, q, at)
}

// asOfTime returns --as-of, or nil when it is not given (the database's clock then).
func (o *dbOptions) asOfTime() (*time.Time, error) {
	if strings.TrimSpace(o.asOf) == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(o.asOf))
	if err != nil {
		return nil, usagef("--as-of %q: want an RFC 3339 time such as 2030-01-01T12:00:00Z", o.asOf)
	}
	return &t, nil
}

// dbError turns an error raised by a stepready function into the database's own message: a refusal such as
// "cannot cancel task 3: it is already complete" is what the operator needs to read, not the SQLSTATE.
func dbError(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) {
		return err
	}
	msg := pgErr.Message
	if pgErr.Detail != "" {
		msg += " (" + pgErr.Detail + ")"
	}
	// Keep the context the error was wrapped in (a file name), replacing only "ERROR: … (SQLSTATE …)".
	return refusalError{msg: strings.Replace(err.Error(), pgErr.Error(), msg, 1), err: err}
}

// refusalError is the database refusing or failing a request; it exits with status 1.
type refusalError struct {
	msg string
	err error
}

func (e refusalError) Error() string { return e.msg }
func (e refusalError) Unwrap() error { return e.err }

// parseID parses a positional id argument.
func parseID(what, arg string) (int64, error) {
	var id int64
	if _, err := fmt.Sscan(arg, &id); err != nil || id <= 0 || fmt.Sprint(id) != arg {
		return 0, usagef("%s %q: want a positive integer id", what, arg)
	}
	return id, nil
}

// writeJSON prints v as indented JSON, the stable format for scripts.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newTable returns a tabwriter for aligned columns; call Flush at the end.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// relative says when t is, seen from now: "in 3.2s", "1m05s ago", "now".
func relative(t, now time.Time) string {
	d := t.Sub(now)
	switch {
	case d > 0:
		return "in " + shortDuration(d)
	case d < 0:
		return shortDuration(-d) + " ago"
	}
	return "now"
}

// shortDuration prints d like the SQL explain messages do: "0.9s", "1m05s", "2h03m"; from two days on, days and
// hours ("1132d11h"), not thousands of hours.
func shortDuration(d time.Duration) string {
	ms := d.Milliseconds()
	switch {
	case ms < 60_000:
		return fmt.Sprintf("%.1fs", float64(ms)/1000)
	case ms < 3_600_000:
		return fmt.Sprintf("%dm%02ds", ms/60_000, ms%60_000/1000)
	case ms < 48*3_600_000:
		return fmt.Sprintf("%dh%02dm", ms/3_600_000, ms%3_600_000/60_000)
	}
	return fmt.Sprintf("%dd%02dh", ms/86_400_000, ms%86_400_000/3_600_000)
}

// orDash prints an optional value, or "-".
func orDash[T any](p *T) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

// jsonArg reads a JSON document given on the command line: the document itself, or @FILE. flag names it in
// errors. The document must be valid JSON; what it means is checked by the database.
func jsonArg(flag, value string) (json.RawMessage, error) {
	if strings.TrimSpace(value) == "" {
		return nil, usagef("%s: a JSON document (or @FILE) is required", flag)
	}
	data := []byte(value)
	if strings.HasPrefix(value, "@") {
		var err error
		if data, err = os.ReadFile(value[1:]); err != nil {
			return nil, usagef("%s: %w", flag, err)
		}
	}
	if !json.Valid(data) {
		return nil, usagef("%s: not valid JSON: %s", flag, strings.TrimSpace(string(data)))
	}
	return json.RawMessage(data), nil
}

// stepRef is a step named on the command line: a step id ("34"), or a task id and a step name ("12/fetch"; step
// names are unique per task).
type stepRef struct {
	id     int64
	taskID int64
	name   string
}

// withStep runs f on a connection with the id of the step ref names (looked up when ref is TASK_ID/STEP_NAME).
func (o *dbOptions) withStep(ctx context.Context, ref stepRef, f func(conn *pgx.Conn, id int64, format string) error) error {
	return o.withConn(ctx, func(conn *pgx.Conn, format string) error {
		id, err := ref.resolve(ctx, conn)
		if err != nil {
			return err
		}
		return f(conn, id, format)
	})
}

// parseStepRef parses STEP_ID or TASK_ID/STEP_NAME.
func parseStepRef(arg string) (stepRef, error) {
	if task, name, ok := strings.Cut(arg, "/"); ok {
		id, err := parseID("TASK_ID of TASK_ID/STEP_NAME", task)
		if err != nil {
			return stepRef{}, err
		}
		if name == "" {
			return stepRef{}, usagef("%q: want TASK_ID/STEP_NAME, with a step name after the slash", arg)
		}
		return stepRef{taskID: id, name: name}, nil
	}
	id, err := parseID("STEP_ID", arg)
	return stepRef{id: id}, err
}

// resolve returns the step's id, looking a TASK_ID/STEP_NAME reference up.
func (r stepRef) resolve(ctx context.Context, q readmodel.Querier) (int64, error) {
	if r.name == "" {
		return r.id, nil
	}
	return readmodel.StepID(ctx, q, r.taskID, r.name)
}
