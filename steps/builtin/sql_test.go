package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// sqlBundle is a test database with a table public.items (rows 1 and 2) and an sql handler on its pool.
type sqlBundle struct {
	db      *pgtest.DB
	handler *sqlHandler
}

func setupSQL(t *testing.T) *sqlBundle {
	t.Helper()
	db := pgtest.New(t)
	_, err := db.Pool.Exec(context.Background(), `
		CREATE TABLE public.items (id int PRIMARY KEY, n int NOT NULL DEFAULT 0, name text UNIQUE);
		INSERT INTO public.items (id, name) VALUES (1, 'one'), (2, 'two');`)
	require.NoError(t, err)
	return &sqlBundle{db: db, handler: &sqlHandler{pool: db.Pool}}
}

// handlerWith returns an sql handler on a new pool of the bundle's database whose sessions have the given
// settings.
func (b *sqlBundle) handlerWith(t *testing.T, settings map[string]string) *sqlHandler {
	t.Helper()
	pool := b.db.NewPool(t, func(config *pgxpool.Config) {
		for k, v := range settings {
			config.ConnConfig.RuntimeParams[k] = v
		}
	})
	return &sqlHandler{pool: pool}
}

// sqlInputJSON returns the handler input for query and args.
func sqlInputJSON(t *testing.T, query string, args ...any) string {
	t.Helper()
	in := map[string]any{"query": query}
	if args != nil {
		in["args"] = args
	}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	return string(b)
}

// waitForLockWait waits until a session of the bundle's database other than the caller's waits for a lock.
func (b *sqlBundle) waitForLockWait(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting bool
		err := b.db.Pool.QueryRow(context.Background(), `
			SELECT count(*) > 0 FROM pg_catalog.pg_stat_activity
			WHERE datname = pg_catalog.current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		require.NoError(t, err)
		return waiting
	}, 30*time.Second, 5*time.Millisecond, "the handler's statement never waited for a lock")
}

func TestSQLOutput(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)
	ctx := context.Background()

	t.Run("Types", func(t *testing.T) {
		t.Parallel()
		out, err := run(ctx, b.handler, sqlInputJSON(t, `
			SELECT $1::int AS i, $2::text AS s, $3::bool AS b, NULL::int AS n, $4::jsonb AS j, $5::int AS nullarg,
			       $6::bigint AS big, $7::numeric AS exact,
			       1.50::numeric AS num, 12345678901234567890::numeric AS bignum, 2.5::float8 AS f,
			       'NaN'::float8 AS nan, '-Infinity'::float4 AS neginf,
			       'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS u,
			       '2024-01-02T03:04:05Z'::timestamptz AS ts, '2024-01-02'::date AS d,
			       '1 day 02:00:00'::interval AS iv, '10.0.0.0/8'::cidr AS net,
			       ARRAY[1, 2] AS arr, ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid] AS uuids,
			       '\x0102'::bytea AS bin, '{"big": 12345678901234567890}'::jsonb AS bigj,
			       '[1, "x"]'::json AS js, 'null'::jsonb AS jnull`,
			42, "x", true, map[string]any{"k": []any{1, "two"}}, nil, json.Number("9007199254740993"), "0.1"), 1)
		require.NoError(t, err)

		var res struct {
			Rows         []map[string]json.RawMessage `json:"rows"`
			RowsAffected int64                        `json:"rows_affected"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &res))
		require.EqualValues(t, 1, res.RowsAffected)
		require.Len(t, res.Rows, 1)
		row := res.Rows[0]

		var ts time.Time
		require.NoError(t, json.Unmarshal(row["ts"], &ts))
		require.True(t, ts.Equal(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)), "ts = %s", ts)
		delete(row, "ts")

		got, err := json.Marshal(row)
		require.NoError(t, err)
		require.JSONEq(t, `{
			"i": 42, "s": "x", "b": true, "n": null, "j": {"k": [1, "two"]}, "nullarg": null,
			"big": 9007199254740993, "exact": 0.1,
			"num": 1.50, "bignum": 12345678901234567890, "f": 2.5,
			"nan": "NaN", "neginf": "-Infinity",
			"u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
			"d": "2024-01-02T00:00:00Z",
			"iv": "1 day 02:00:00", "net": "10.0.0.0/8",
			"arr": [1, 2], "uuids": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
			"bin": "AQI=", "bigj": {"big": 12345678901234567890},
			"js": [1, "x"], "jnull": null
		}`, string(got))
		require.Equal(t, "9007199254740993", string(row["big"]), "bigint keeps every digit (the argument too)")
		require.Equal(t, "0.1", string(row["exact"]), "numeric is exact")
		require.Equal(t, "12345678901234567890", string(row["bignum"]), "numeric keeps every digit")
		require.Contains(t, string(row["bigj"]), "12345678901234567890", "jsonb keeps every digit")
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		out, err := run(ctx, b.handler, sqlInputJSON(t, `SELECT id FROM public.items WHERE id < 0`), 1)
		require.NoError(t, err)
		require.JSONEq(t, `{"rows": [], "rows_affected": 0}`, out)
	})

	t.Run("InsertAffectsRows", func(t *testing.T) {
		t.Parallel()
		out, err := run(ctx, b.handler, sqlInputJSON(t,
			`INSERT INTO public.items (id, name) VALUES ($1, $2), ($1 + 1, $3)`, 10, "ten", "eleven"), 1)
		require.NoError(t, err)
		require.JSONEq(t, `{"rows": [], "rows_affected": 2}`, out)
	})

	t.Run("InsertReturning", func(t *testing.T) {
		t.Parallel()
		out, err := run(ctx, b.handler, sqlInputJSON(t,
			`INSERT INTO public.items (id, n) SELECT x, $1 FROM unnest($2::int[]) x ORDER BY x RETURNING id, n`,
			5, "{20,21}"), 1)
		require.NoError(t, err)
		require.JSONEq(t, `{"rows": [{"id": 20, "n": 5}, {"id": 21, "n": 5}], "rows_affected": 2}`, out)
	})
}

func TestSQLClassification(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)

	// Another session holds row 1 locked for the whole test.
	other := b.db.Conn(t)
	tx, err := other.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(context.Background(), `SELECT 1 FROM public.items WHERE id = 1 FOR UPDATE`)
	require.NoError(t, err)

	refusedConfig, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=5")
	require.NoError(t, err)
	refused, err := pgxpool.NewWithConfig(context.Background(), refusedConfig) // connects lazily
	require.NoError(t, err)
	t.Cleanup(refused.Close)

	for _, tc := range []struct {
		name       string
		handler    *sqlHandler // nil: b.handler
		query      string
		args       []any
		ctxTimeout time.Duration
		wantClass  string
		wantCode   string
	}{
		{name: "SyntaxError", query: `SELEC 1`, wantClass: steps.ClassPermanent, wantCode: "42601"},
		{name: "MultipleStatements", query: `SELECT 1; SELECT 2`, wantClass: steps.ClassPermanent, wantCode: "42601"},
		{name: "UndefinedTable", query: `SELECT * FROM public.nope`, wantClass: steps.ClassPermanent, wantCode: "42P01"},
		{name: "UniqueViolation", query: `INSERT INTO public.items (id, name) VALUES (99, 'one')`, wantClass: steps.ClassPermanent, wantCode: "23505"},
		{name: "BadArgumentText", query: `SELECT $1::int`, args: []any{"abc"}, wantClass: steps.ClassPermanent, wantCode: "22P02"},
		// Detected by pgx before anything is sent: no SQLSTATE, so transient like a connection error.
		{name: "ArgumentCountMismatch", query: `SELECT $1::int, $2::int`, args: []any{1}, wantClass: steps.ClassTransient},
		{name: "RaisedSerializationFailure", query: `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`, wantClass: steps.ClassTransient, wantCode: "40001"},
		{name: "RaisedConnectionFailure", query: `DO $$ BEGIN RAISE EXCEPTION 'link down' USING ERRCODE = '08006'; END $$`, wantClass: steps.ClassTransient, wantCode: "08006"},
		{name: "RaisedCustom", query: `DO $$ BEGIN RAISE EXCEPTION 'nope' USING ERRCODE = 'P0001'; END $$`, wantClass: steps.ClassPermanent, wantCode: "P0001"},
		{name: "NoWait", query: `SELECT id FROM public.items WHERE id = 1 FOR UPDATE NOWAIT`, wantClass: steps.ClassTransient, wantCode: "55P03"},
		{
			name:    "LockTimeout",
			handler: b.handlerWith(t, map[string]string{"lock_timeout": "50ms"}),
			query:   `UPDATE public.items SET n = n + 1 WHERE id = 1`, wantClass: steps.ClassTransient, wantCode: "55P03",
		},
		{
			name:    "StatementTimeout",
			handler: b.handlerWith(t, map[string]string{"statement_timeout": "50ms"}),
			query:   `SELECT pg_catalog.pg_sleep(30)`, wantClass: steps.ClassTransient, wantCode: "57014",
		},
		{name: "StepDeadline", query: `SELECT pg_catalog.pg_sleep(30)`, ctxTimeout: 100 * time.Millisecond, wantClass: steps.ClassTimeout},
		{name: "ConnectionRefused", handler: &sqlHandler{pool: refused}, query: `SELECT 1`, wantClass: steps.ClassTransient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := tc.handler
			if h == nil {
				h = b.handler
			}
			ctx := context.Background()
			if tc.ctxTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctxTimeout)
				defer cancel()
			}
			_, err := run(ctx, h, sqlInputJSON(t, tc.query, tc.args...), 1)
			fail := requireClass(t, err, tc.wantClass)
			require.Equal(t, tc.wantCode, fail.Code)
			require.ErrorContains(t, err, "sql handler: ")
			if tc.wantCode != "" {
				var pgErr *pgconn.PgError
				require.True(t, errors.As(err, &pgErr), "the *pgconn.PgError stays reachable")
			}
		})
	}
}

// TestSQLSerializationFailure provokes a real 40001: the handler's serializable statement takes its snapshot,
// waits for a row another transaction updates, and that transaction commits.
func TestSQLSerializationFailure(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)
	ctx := context.Background()
	h := b.handlerWith(t, map[string]string{"default_transaction_isolation": "serializable"})

	tx, err := b.db.Conn(t).Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `UPDATE public.items SET n = n + 1 WHERE id = 1`)
	require.NoError(t, err)

	result := make(chan error, 1)
	go func() {
		_, err := run(ctx, h, sqlInputJSON(t, `UPDATE public.items SET n = n + 10 WHERE id = 1`), 1)
		result <- err
	}()
	b.waitForLockWait(t)
	require.NoError(t, tx.Commit(ctx))

	err = <-result
	fail := requireClass(t, err, steps.ClassTransient)
	require.Equal(t, "40001", fail.Code)
}

// TestSQLDeadlock provokes a real 40P01: the handler's statement locks row 1 and waits for row 2, held by
// another transaction, which then asks for row 1. The handler waited first, so its deadlock check runs first
// and it is the one aborted.
func TestSQLDeadlock(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)
	ctx := context.Background()

	tx, err := b.db.Conn(t).Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	// The session whose deadlock_timeout runs out first detects the deadlock and is aborted: make it the
	// handler's, whatever the load on the machine (it was the test's own now and then).
	_, err = tx.Exec(ctx, `SET LOCAL deadlock_timeout = '30s'`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE public.items SET n = n + 1 WHERE id = 2`)
	require.NoError(t, err)

	result := make(chan error, 1)
	go func() {
		_, err := run(ctx, b.handler, sqlInputJSON(t, `DO $$ BEGIN
			UPDATE public.items SET n = n + 10 WHERE id = 1;
			UPDATE public.items SET n = n + 10 WHERE id = 2;
		END $$`), 1)
		result <- err
	}()
	b.waitForLockWait(t)
	_, err = tx.Exec(ctx, `UPDATE public.items SET n = n + 1 WHERE id = 1`) // waits until the handler is aborted
	require.NoError(t, err)

	err = <-result
	fail := requireClass(t, err, steps.ClassTransient)
	require.Equal(t, "40P01", fail.Code)
}

func TestSQLCancelled(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	_, err := run(ctx, b.handler, sqlInputJSON(t, `SELECT 1`), 1)
	require.ErrorIs(t, err, context.Canceled)
	_, classified := steps.AsError(err)
	require.False(t, classified, "a cancelled attempt is the context's error, for the daemon to hand back")
}

func TestSQLBadInput(t *testing.T) {
	t.Parallel()
	h := &sqlHandler{} // never reaches the pool

	for _, tc := range []struct {
		name, input, wantMsg string
	}{
		{"MissingQuery", `{"args": [1]}`, `field "query": required`},
		{"Empty", ``, `field "query": required`},
		{"UnknownField", `{"query": "SELECT 1", "params": [1]}`, `unknown field "params"`},
		{"ArgsNotAnArray", `{"query": "SELECT 1", "args": {"a": 1}}`, "args"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := run(context.Background(), h, tc.input, 1)
			requireClass(t, err, steps.ClassPermanent)
			require.ErrorContains(t, err, "step test-step: bad input")
			require.ErrorContains(t, err, tc.wantMsg)
		})
	}
}

func TestClassifySQLError(t *testing.T) {
	t.Parallel()
	background := context.Background()
	expired, cancel := context.WithDeadline(background, time.Unix(0, 0))
	t.Cleanup(cancel)

	for _, tc := range []struct {
		name      string
		ctx       context.Context
		err       error
		wantClass string
		wantCode  string
	}{
		{"Serialization", background, &pgconn.PgError{Code: "40001"}, steps.ClassTransient, "40001"},
		{"Deadlock", background, &pgconn.PgError{Code: "40P01"}, steps.ClassTransient, "40P01"},
		{"LockNotAvailable", background, &pgconn.PgError{Code: "55P03"}, steps.ClassTransient, "55P03"},
		{"QueryCanceled", background, &pgconn.PgError{Code: "57014"}, steps.ClassTransient, "57014"},
		{"ConnectionException", background, &pgconn.PgError{Code: "08000"}, steps.ClassTransient, "08000"},
		{"AdminShutdownIsPermanent", background, &pgconn.PgError{Code: "57P01"}, steps.ClassPermanent, "57P01"},
		{"MessageIsIgnored", background, &pgconn.PgError{Code: "42601", Message: "deadlock detected"}, steps.ClassPermanent, "42601"},
		{"Wrapped", background, fmt.Errorf("x: %w", &pgconn.PgError{Code: "40P01"}), steps.ClassTransient, "40P01"},
		{"NoSQLSTATE", background, pgx.ErrTxClosed, steps.ClassTransient, ""},
		{"Deadline", expired, &pgconn.PgError{Code: "57014"}, steps.ClassTimeout, "57014"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := classifySQLError(tc.ctx, tc.err)
			fail := requireClass(t, err, tc.wantClass)
			require.Equal(t, tc.wantCode, fail.Code)
			require.ErrorIs(t, err, tc.err)
		})
	}
}

// TestSQLDisabledWithoutAPool: with no pool for step SQL, `sql` is registered and fails every step permanent,
// saying how to enable it (SPEC §17: step SQL never runs on the scheduler's connection).
func TestSQLDisabledWithoutAPool(t *testing.T) {
	t.Parallel()
	reg := steps.NewRegistry()
	require.NoError(t, Register(reg, Options{}))
	h, ok := reg.Lookup("sql")
	require.True(t, ok)
	_, err := h.Handle(context.Background(), &steps.Step{Name: "s", Attempt: 1, Input: json.RawMessage(`{"query": "SELECT 1"}`)})
	fail := requireClass(t, err, steps.ClassPermanent)
	require.Equal(t, "sql_disabled", fail.Code)
	require.ErrorContains(t, err, "--sql-database-url")
}

// TestSQLOnARoleWithoutStepreadyRights: step SQL run through a pool whose role has no stepready rights cannot
// read or change stepready's tables (a task author cannot mark steps complete through a `sql` step), while the
// application's own tables work.
func TestSQLOnARoleWithoutStepreadyRights(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `GRANT SELECT, UPDATE ON public.items TO PUBLIC`)
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, b.db.LoginRole(t, ""))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	h := &sqlHandler{pool: pool}

	_, err = run(ctx, h, sqlInputJSON(t, `UPDATE public.items SET n = n + 1 WHERE id = 1`), 1)
	require.NoError(t, err, "the application's own table")
	for _, q := range []string{
		`UPDATE stepready.steps SET state = 'complete'`,
		`SELECT count(*) FROM stepready.tasks`,
		`SELECT stepready.cancel_task(1, 'x')`,
	} {
		_, err := run(ctx, h, sqlInputJSON(t, q), 1)
		require.Error(t, err, q)
		fail := requireClass(t, err, steps.ClassPermanent)
		require.Equal(t, "42501", fail.Code, "%s: %v", q, err)
	}
}
