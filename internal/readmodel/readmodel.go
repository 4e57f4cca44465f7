// Package readmodel is what operators read, once: typed values (TaskSummary, TaskDetail, StepDetail, Event,
// Explanation, Policy, Simulation, Template…) with JSON tags, each scanned in one place from the queries of
// queries.sql. The web console, the CLI (its tables and its --output json) and the metrics only render them
// (STYLE: one read model, many faces), so a value means the same on every face.
//
// The scheduling rules stay in SQL (explain_task, step_readiness, task_execution_context, queue_stats,
// flow_status): nothing here re-derives them. A page that shows several things of one task reads them in one
// snapshot (Snapshot: one REPEATABLE READ, READ ONLY transaction), so its parts agree with each other.
package readmodel

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed queries.sql
var queriesSQL string

// queries maps a query name ("-- name: x" in queries.sql) to its text.
var queries = mustParseQueries(queriesSQL)

// ErrNotFound is what errors.Is finds in the error of a read whose task, step or policy does not exist; the
// error's own message says what was missing ("task 12 does not exist").
var ErrNotFound = errors.New("not found")

// notFound is an error that says what was missing and is ErrNotFound.
type notFound struct{ msg string }

func (e notFound) Error() string        { return e.msg }
func (e notFound) Is(target error) bool { return target == ErrNotFound }

func notFoundf(format string, args ...any) error { return notFound{fmt.Sprintf(format, args...)} }

// Querier runs reads: a pool, a connection or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner opens the snapshot of a multi-part read: a pool or a connection.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Snapshot runs read in one REPEATABLE READ, READ ONLY transaction: every statement in it sees the same state of
// the database, and now() is the same instant throughout.
func Snapshot(ctx context.Context, db Beginner, read func(tx pgx.Tx) error) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("readmodel: begin snapshot: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := read(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Now returns asOf when it is set, else the database's now() (in a snapshot: the snapshot's instant).
func Now(ctx context.Context, q Querier, asOf *time.Time) (time.Time, error) {
	if asOf != nil {
		return *asOf, nil
	}
	var now time.Time
	if err := q.QueryRow(ctx, query("now")).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("readmodel: read the database's time: %w", err)
	}
	return now, nil
}

// mustParseQueries splits a file of "-- name: x" sections; it panics on a duplicate or empty name (a build-time
// mistake caught by every test).
func mustParseQueries(text string) map[string]string {
	out := map[string]string{}
	var name string
	var body strings.Builder
	flush := func() {
		if name != "" {
			out[name] = strings.TrimSpace(body.String())
		}
		body.Reset()
	}
	for line := range strings.SplitSeq(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "-- name:"); ok {
			flush()
			name = strings.TrimSpace(rest)
			if name == "" {
				panic("readmodel: queries.sql: empty query name")
			}
			if _, dup := out[name]; dup {
				panic(fmt.Sprintf("readmodel: queries.sql: query %q twice", name))
			}
			continue
		}
		body.WriteString(line)
		body.WriteByte('\n')
	}
	flush()
	return out
}

// query returns the query named name; it panics on an unknown name (a programming mistake every test of its
// caller catches).
func query(name string) string {
	s, ok := queries[name]
	if !ok {
		panic(fmt.Sprintf("readmodel: no query %q in queries.sql", name))
	}
	return s
}

// collect runs query name with args and scans every row with scan.
func collect[T any](ctx context.Context, q Querier, name string, scan func(pgx.Row, *T) error, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, query(name), args...)
	if err != nil {
		return nil, fmt.Errorf("readmodel: %s: %w", name, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (T, error) {
		var v T
		err := scan(row, &v)
		return v, err
	})
	if err != nil {
		return nil, fmt.Errorf("readmodel: %s: %w", name, err)
	}
	if out == nil {
		out = []T{}
	}
	return out, nil
}

// optText is NULL for an empty filter.
func optText(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// optID is NULL for a zero id.
func optID(id int64) *int64 {
	if id == 0 {
		return nil
	}
	return &id
}
