package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// PoolerQueryExecMode is the pgx query mode of stepready's connections where a transaction pooler (PgBouncer in
// pool_mode = transaction) may stand between them and PostgreSQL: the daemon with poll-only, the CLI, `scheduler
// ui`. pgx's default, cache_statement, prepares named statements ("stmtcache_…") on the server connection, and
// a transaction pooler gives the next transaction another server connection: "prepared statement … does not
// exist" there, "already exists" on a connection that served another client. QueryExecModeExec sends every
// statement with the unnamed statement in one round trip (parameters and results in text format, parameter
// types inferred by the server), so nothing outlives the statement; docs/daemon.md ("Behind PgBouncer") gives
// what it costs, measured against cache_describe, the other mode that works through a pooler.
const PoolerQueryExecMode = pgx.QueryExecModeExec

// queryExecModeParam is pgx's connection string parameter of the query mode.
const queryExecModeParam = "default_query_exec_mode"

// UsePoolerQueryMode makes cfg work through a transaction pooler: it sets PoolerQueryExecMode, unless the
// connection string names default_query_exec_mode or cfg was given another mode than pgx's default in code
// (the user chose: cache_statement is right behind PgBouncer 1.21+ with max_prepared_statements, for example).
// It reports whether it changed cfg.
func UsePoolerQueryMode(cfg *pgx.ConnConfig) bool {
	if cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement ||
		strings.Contains(cfg.ConnString(), queryExecModeParam) {
		return false
	}
	cfg.DefaultQueryExecMode = PoolerQueryExecMode
	return true
}

// NameActor names who acts in tx: the operator functions record it as details.actor of their events
// (sql/090_operators.sql, _operator_details). The setting is local to tx, never to the session, so it works
// through a transaction pooler (a session setting would stay on a server connection that serves others next;
// a startup parameter is refused by PgBouncer) and cannot leak into another transaction.
func NameActor(ctx context.Context, tx pgx.Tx, actor string) error {
	if _, err := tx.Exec(ctx, `SELECT set_config('stepready.actor', $1, true)`, actor); err != nil {
		return fmt.Errorf("store: name the actor: %w", err)
	}
	return nil
}
