package migrations

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	stepreadysql "github.com/stepready/stepready/sql"
)

// digestComment starts the comment that Up records on the stepready schema, before the digest of its functions.
const digestComment = "stepready functions "

// quoteLiteral quotes s as a SQL string literal (COMMENT takes no parameter).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Errors of Check: errors.Is finds one of them in its error, whose message says what to do.
var (
	// ErrNotMigrated: the database has no stepready schema (no version applied).
	ErrNotMigrated = errors.New("database not migrated")
	// ErrSchemaOlder: the database's schema or functions are older than this binary's, or another build's.
	ErrSchemaOlder = errors.New("database schema older than this binary")
	// ErrSchemaNewer: the database's schema is newer than this binary's.
	ErrSchemaNewer = errors.New("database schema newer than this binary")
	// ErrSchemaDirty: a migration failed part-way.
	ErrSchemaDirty = errors.New("database schema dirty")
)

// checkError says what Check found and what to do; errors.Is finds its kind.
type checkError struct {
	kind error
	msg  string
}

func (e *checkError) Error() string        { return e.msg }
func (e *checkError) Is(target error) bool { return target == e.kind }

// Querier is what Check reads with: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Check compares the database's stepready schema version and functions with this binary's: the daemon, the
// console and every command run it after connecting, so a database that was never migrated, or migrated by
// another version of stepready, is named as such ("database not migrated: run `scheduler migrate up`") instead of
// failing later on a missing relation or function. It only reads (as any role that may connect).
func Check(ctx context.Context, q Querier) error {
	latest, err := latestSchemaVersion()
	if err != nil {
		return fmt.Errorf("migrations: check: %w", err)
	}
	version, dirty, err := schemaVersion(ctx, q)
	if err != nil {
		return fmt.Errorf("migrations: check: %w", err)
	}
	switch {
	case version <= 0:
		return &checkError{ErrNotMigrated, "database not migrated: run `scheduler migrate up`"}
	case dirty:
		return &checkError{ErrSchemaDirty, fmt.Sprintf("database schema version %d is dirty (a migration failed "+
			"part-way): see `scheduler migrate status`", version)}
	case uint(version) > latest:
		return &checkError{ErrSchemaNewer, fmt.Sprintf("database schema %d is newer than this binary (%d): run a "+
			"newer scheduler", version, latest)}
	case uint(version) < latest:
		return &checkError{ErrSchemaOlder, fmt.Sprintf("database schema %d is older than this binary (%d): run "+
			"`scheduler migrate up`", version, latest)}
	}
	digest, err := stepreadysql.Digest()
	if err != nil {
		return fmt.Errorf("migrations: check: %w", err)
	}
	var comment *string
	if err := q.QueryRow(ctx, `SELECT pg_catalog.obj_description(n.oid, 'pg_namespace')
		FROM pg_catalog.pg_namespace n WHERE n.nspname = 'stepready'`).Scan(&comment); err != nil &&
		!errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("migrations: check: read the functions' digest: %w", err)
	}
	if comment == nil || *comment != digestComment+digest {
		return &checkError{ErrSchemaOlder, fmt.Sprintf("database schema %d has functions of another build of "+
			"stepready: run `scheduler migrate up` with this one", version)}
	}
	return nil
}
