package stepready

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what the library's calls need to reach the database: *pgxpool.Pool, *pgx.Conn and pgx.Tx all satisfy
// it, so a call runs on a pool, on a connection, or inside the caller's own transaction (and commits or rolls back
// with it).
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
