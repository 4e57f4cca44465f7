// Package migrations brings a PostgreSQL database to the schema this build of stepready expects, and back.
//
// A database holds three layers, applied in this order by Up and removed in reverse by Down:
//
//  1. The versioned stepready schema: the NNNNNN_name.up.sql / .down.sql files of this directory (tables,
//     constraints, indexes, seed rows), applied by golang-migrate. Its bookkeeping table is
//     public.stepready_schema_migrations (MigrationsTable); golang-migrate serializes concurrent migrators with a
//     session advisory lock of its own.
//  2. Behaviour: every function and trigger, the files of package sql, re-applied in file-name order on every Up,
//     all in one transaction that first takes a transaction advisory lock, so a half-applied set is never visible
//     and concurrent migrators apply it one after the other.
//  3. River's tables (the job queue that dispatches steps), migrated by rivermigrate under a session advisory lock
//     of ours, because rivermigrate takes none and two processes migrating River at once would collide.
//
// Every step is idempotent, so Up may run on every deploy and from several processes at once.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	stepreadysql "github.com/stepready/stepready/sql"
)

// FS holds the versioned schema migrations, NNNNNN_name.up.sql and NNNNNN_name.down.sql, embedded at build time.
// Each file wraps itself in BEGIN; … COMMIT; so that a failing file leaves nothing behind.
//
//go:embed *.sql
var FS embed.FS

// MigrationsTable is the name of golang-migrate's bookkeeping table (one row: version, dirty). It lives in the
// public schema, beside stepready's own schema, so that dropping the stepready schema never loses track of
// the version.
const MigrationsTable = "stepready_schema_migrations"

// migrationsSchema is the schema of MigrationsTable. It is fixed rather than taken from the connection's
// search_path so that every caller finds the same table.
const migrationsSchema = "public"

// Advisory lock keys. They only need to differ from each other and from golang-migrate's own key (a CRC of the
// database, schema and table names). Written as ASCII so they are recognisable in pg_locks.
const (
	// sqlApplyLockKey ("StepSql\x01") is taken with pg_advisory_xact_lock by the transaction that applies the
	// files of package sql.
	sqlApplyLockKey int64 = 0x5374_6570_5371_6c01

	// riverLockKey ("StepRvr\x01") is held with pg_advisory_lock while River's migrations run.
	riverLockKey int64 = 0x5374_6570_5276_7201
)

// DefaultLockTimeout is how long Up, Down and Force wait for golang-migrate's advisory lock when ctx has no
// deadline: long enough for another process to finish a migration, short enough that a stuck migrator is
// reported rather than waited on forever. With a deadline on ctx, the time left until it is used instead.
const DefaultLockTimeout = 5 * time.Minute

// Up migrates the database at databaseURL to the newest schema of this build: the versioned stepready schema,
// then every file of package sql, then River's migrations. It is idempotent and safe to run from several
// processes at once. logger receives progress at info level; nil discards it.
//
// A failure names the layer and the file that failed. A failed versioned migration leaves its version marked
// dirty in MigrationsTable; every later Up refuses to run until Force sets the version that is really in place.
func Up(ctx context.Context, databaseURL string, logger *slog.Logger) error {
	return UpWith(ctx, databaseURL, logger, UpOptions{})
}

// UpOptions adjust UpWith.
type UpOptions struct {
	// SkipRoles leaves out creating the four roles of docs/security.md (stepready_client, stepready_worker,
	// stepready_operator, stepready_reader), for a migrating user that may not create roles (no CREATEROLE),
	// where a DBA created them. Their privileges are granted all the same, to those that exist.
	SkipRoles bool
}

// UpWith is Up with options. After River's migrations it applies a fourth layer, the least-privilege roles of
// docs/security.md (the files of migrations/roles): the roles are created unless they exist (unless opts.SkipRoles), and
// every privilege and SECURITY DEFINER attribute is granted again, since re-created functions lose theirs.
func UpWith(ctx context.Context, databaseURL string, logger *slog.Logger, opts UpOptions) error {
	logger = orDiscard(logger)

	if err := schemaUp(ctx, databaseURL, logger); err != nil {
		return fmt.Errorf("migrations: up: stepready schema: %w", err)
	}
	if err := applySQL(ctx, databaseURL, logger); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	if err := riverMigrate(ctx, databaseURL, logger, rivermigrate.DirectionUp); err != nil {
		return fmt.Errorf("migrations: up: river: %w", err)
	}
	if err := applyRoles(ctx, databaseURL, logger, opts.SkipRoles); err != nil {
		return fmt.Errorf("migrations: up: roles: %w", err)
	}
	return nil
}

// rolesFS holds the roles layer: roles_create.sql (the roles, cluster-wide) and roles.sql (the grants of this
// database).
//
//go:embed roles/*.sql
var rolesFS embed.FS

// applyRoles applies the roles layer in one transaction, serialized with the other layers' migrators by the
// same transaction advisory lock as the functions.
func applyRoles(ctx context.Context, databaseURL string, logger *slog.Logger, skipCreate bool) error {
	files := []string{"roles/roles_create.sql", "roles/roles.sql"}
	if skipCreate {
		files = files[1:]
	}
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	start := time.Now()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", sqlApplyLockKey); err != nil {
			return fmt.Errorf("take advisory lock: %w", err)
		}
		for _, name := range files {
			contents, err := fs.ReadFile(rolesFS, name)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, string(contents)); err != nil {
				return fmt.Errorf("migrations/%s%s: %w", name, errorLine(string(contents), err), err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	logger.InfoContext(ctx, "migrations: applied roles and privileges", slog.Bool("roles_created", !skipCreate),
		slog.Duration("duration", time.Since(start)))
	return nil
}

// Down steps the versioned stepready schema down: every applied version when steps <= 0, else at most steps
// versions. River's tables go only with the last stepready version (steps <= 0, or steps reaching version zero):
// a rollback of some versions keeps them, and the jobs in them. Functions and triggers go with the schema that holds them. Data in the removed tables is
// lost: Down is for development and rollback, not for routine use.
func Down(ctx context.Context, databaseURL string, logger *slog.Logger, steps int) error {
	logger = orDiscard(logger)

	if steps > 0 {
		// A rollback of some versions keeps River's tables (and the jobs in them): stepready still uses them.
		// They go only with the last stepready version.
		state, err := Status(ctx, databaseURL)
		if err != nil {
			return fmt.Errorf("migrations: down: %w", err)
		}
		if uint(steps) < state.Version {
			if err := schemaDown(ctx, databaseURL, logger, steps); err != nil {
				return fmt.Errorf("migrations: down: stepready schema: %w", err)
			}
			return nil
		}
		steps = 0
	}
	if err := riverMigrate(ctx, databaseURL, logger, rivermigrate.DirectionDown); err != nil {
		return fmt.Errorf("migrations: down: river: %w", err)
	}
	if err := schemaDown(ctx, databaseURL, logger, steps); err != nil {
		return fmt.Errorf("migrations: down: stepready schema: %w", err)
	}
	return nil
}

// Force records version as the applied stepready schema version and clears the dirty flag, without running any
// migration. It is the way out after a failed migration left the version dirty: repair the database by hand,
// then force the version that is really in place (the version before the failed one when its file rolled back, as
// every file here does). version -1 records that no version is applied.
func Force(ctx context.Context, databaseURL string, logger *slog.Logger, version int) (err error) {
	logger = orDiscard(logger)
	if version < -1 {
		return fmt.Errorf("migrations: force: version %d: must be -1 or more", version)
	}

	m, err := newSchemaMigrate(ctx, databaseURL, logger)
	if err != nil {
		return fmt.Errorf("migrations: force: %w", err)
	}
	defer closeMigrate(m, &err)

	if err := m.Force(version); err != nil {
		return fmt.Errorf("migrations: force: version %d: %w", version, err)
	}
	logger.InfoContext(ctx, "migrations: forced stepready schema version", slog.Int("version", version))
	return nil
}

// State is where a database stands, as reported by Status.
type State struct {
	// Version is the applied stepready schema version; 0 when none is applied.
	Version uint

	// Dirty is true when the migration to Version failed part-way; Up refuses to run until Force clears it.
	Dirty bool

	// Latest is the newest stepready schema version embedded in this build.
	Latest uint

	// RiverVersion is the newest applied River migration; 0 when River's tables do not exist.
	RiverVersion int

	// RiverLatest is the newest River migration known to this build.
	RiverLatest int
}

// UpToDate reports whether Up has nothing left to do for the versioned layers (functions and triggers are
// re-applied by every Up regardless).
func (s State) UpToDate() bool {
	return !s.Dirty && s.Version == s.Latest && s.RiverVersion == s.RiverLatest
}

// Status reports the applied and the latest versions of the stepready schema and of River's schema. It only
// reads: unlike Up it creates no table, so it is safe against a database that was never migrated.
func Status(ctx context.Context, databaseURL string) (State, error) {
	var state State

	latest, err := latestSchemaVersion()
	if err != nil {
		return state, fmt.Errorf("migrations: status: %w", err)
	}
	state.Latest = latest

	pool, err := openPool(ctx, databaseURL)
	if err != nil {
		return state, fmt.Errorf("migrations: status: %w", err)
	}
	defer pool.Close()

	version, dirty, err := schemaVersion(ctx, pool)
	if err != nil {
		return state, fmt.Errorf("migrations: status: %w", err)
	}
	state.Version, state.Dirty = uint(max(version, 0)), dirty

	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: orDiscard(nil)})
	if err != nil {
		return state, fmt.Errorf("migrations: status: river: %w", err)
	}
	applied, err := migrator.ExistingVersions(ctx)
	if err != nil {
		return state, fmt.Errorf("migrations: status: river: %w", err)
	}
	for _, migration := range applied {
		state.RiverVersion = max(state.RiverVersion, migration.Version)
	}
	for _, migration := range migrator.AllVersions() {
		state.RiverLatest = max(state.RiverLatest, migration.Version)
	}
	return state, nil
}

// schemaUp applies every pending versioned migration.
func schemaUp(ctx context.Context, databaseURL string, logger *slog.Logger) (err error) {
	m, err := newSchemaMigrate(ctx, databaseURL, logger)
	if err != nil {
		return err
	}
	defer closeMigrate(m, &err)

	// golang-migrate takes no context; stop it between two files when ctx ends.
	stop := context.AfterFunc(ctx, func() { m.GracefulStop <- true })
	defer stop()

	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return describeSchemaError(ctx, databaseURL, "up", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("stopped: %w", err)
	}

	version, dirty, err := m.Version()
	if err != nil && !errors.Is(err, migrate.ErrNilVersion) {
		return fmt.Errorf("read version: %w", err)
	}
	logger.InfoContext(ctx, "migrations: stepready schema is up to date",
		slog.Uint64("version", uint64(version)), slog.Bool("dirty", dirty))
	return nil
}

// schemaDown steps the versioned schema down by steps versions, or all of them when steps <= 0.
func schemaDown(ctx context.Context, databaseURL string, logger *slog.Logger, steps int) (err error) {
	m, err := newSchemaMigrate(ctx, databaseURL, logger)
	if err != nil {
		return err
	}
	defer closeMigrate(m, &err)

	stop := context.AfterFunc(ctx, func() { m.GracefulStop <- true })
	defer stop()

	switch _, _, verr := m.Version(); {
	case errors.Is(verr, migrate.ErrNilVersion):
		// golang-migrate's Steps fails on a database without a version; there is simply nothing to remove.
		err = migrate.ErrNoChange
	case verr != nil:
		return fmt.Errorf("read version: %w", verr)
	case steps <= 0:
		err = m.Down()
	default:
		err = m.Steps(-steps)
	}
	var short migrate.ErrShortLimit
	switch {
	case err == nil, errors.Is(err, migrate.ErrNoChange):
	case errors.As(err, &short):
		logger.WarnContext(ctx, "migrations: fewer stepready schema versions than steps requested; all were removed",
			slog.Int("steps", steps), slog.Uint64("missing", uint64(short.Short)))
	default:
		return describeSchemaError(ctx, databaseURL, "down", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("stopped: %w", err)
	}

	version, _, err := m.Version()
	if err != nil && !errors.Is(err, migrate.ErrNilVersion) {
		return fmt.Errorf("read version: %w", err)
	}
	logger.InfoContext(ctx, "migrations: stepready schema stepped down", slog.Uint64("version", uint64(version)))
	return nil
}

// newSchemaMigrate opens golang-migrate over the embedded files and a database/sql handle on databaseURL (pgx
// stdlib, so the same driver and the same URL syntax as everywhere else). The caller closes it with
// closeMigrate.
func newSchemaMigrate(ctx context.Context, databaseURL string, logger *slog.Logger) (*migrate.Migrate, error) {
	connConfig, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	db := stdlib.OpenDB(*connConfig)
	if err := db.PingContext(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("connect: %w", err), db.Close())
	}

	driver, err := migratepgx.WithInstance(db, &migratepgx.Config{
		MigrationsTable: MigrationsTable,
		SchemaName:      migrationsSchema,
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open migrations table: %w", err), db.Close())
	}

	source, err := iofs.New(FS, ".")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("read embedded migrations: %w", err), driver.Close())
	}

	m, err := migrate.NewWithInstance("iofs", source, "pgx5", driver)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("start golang-migrate: %w", err), source.Close(), driver.Close())
	}
	m.Log = migrateLogger{ctx: ctx, logger: logger}
	m.LockTimeout = DefaultLockTimeout
	if deadline, ok := ctx.Deadline(); ok {
		m.LockTimeout = max(time.Until(deadline), time.Millisecond)
	}
	return m, nil
}

// closeMigrate closes m (its source, its connection and its *sql.DB) and joins a close failure into *errp.
func closeMigrate(m *migrate.Migrate, errp *error) {
	sourceErr, dbErr := m.Close()
	if sourceErr != nil {
		*errp = errors.Join(*errp, fmt.Errorf("close migration source: %w", sourceErr))
	}
	if dbErr != nil {
		*errp = errors.Join(*errp, fmt.Errorf("close database: %w", dbErr))
	}
}

// describeSchemaError turns a golang-migrate failure into an error that names the file and line that failed,
// without repeating the whole file as golang-migrate's own message does. It reads the recorded version on a
// connection of its own: golang-migrate's connection may be stuck in the failed file's aborted transaction.
func describeSchemaError(ctx context.Context, databaseURL, direction string, err error) error {
	var dirty migrate.ErrDirty
	if errors.As(err, &dirty) {
		return fmt.Errorf("version %d is dirty: an earlier migration failed part-way; repair the database, "+
			"then force the version really in place (scheduler migrate force VERSION): %w", dirty.Version, err)
	}

	recorded := func() (int64, bool, bool) {
		conn, cerr := pgx.Connect(ctx, databaseURL)
		if cerr != nil {
			return 0, false, false
		}
		defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
		version, isDirty, verr := schemaVersion(ctx, conn)
		return version, isDirty, verr == nil
	}

	if errors.Is(err, fs.ErrNotExist) {
		if version, _, ok := recorded(); ok {
			return fmt.Errorf("the database is at version %d, which has no migration file in this build "+
				"(was it migrated by a newer stepready?): %w", version, err)
		}
		return err
	}

	var dbErr database.Error
	var dbErrPtr *database.Error
	switch {
	case errors.As(err, &dbErr):
	case errors.As(err, &dbErrPtr) && dbErrPtr != nil:
		dbErr = *dbErrPtr
	default:
		return err
	}

	where := "migration"
	// golang-migrate marks the version it is moving to as dirty before running a file, which names the file.
	if version, isDirty, ok := recorded(); ok && isDirty {
		where = "migrations/" + failedFileName(direction, version)
	}

	var pgErr *pgconn.PgError
	if errors.As(dbErr.OrigErr, &pgErr) {
		return fmt.Errorf("%s%s: %w", where, errorLine(string(dbErr.Query), pgErr), pgErr)
	}
	if dbErr.OrigErr != nil {
		return fmt.Errorf("%s: %s: %w", where, dbErr.Err, dbErr.OrigErr)
	}
	return fmt.Errorf("%s: %s", where, dbErr.Err)
}

// failedFileName names the file that was running when golang-migrate recorded dirtyVersion: going up, the up
// file of that version; going down, the down file of the version above it (the version being removed).
func failedFileName(direction string, dirtyVersion int64) string {
	if direction == "up" {
		return schemaFileName(uint(max(dirtyVersion, 0)), "up")
	}

	source, err := iofs.New(FS, ".")
	if err != nil {
		return "a down migration"
	}
	defer func() { _ = source.Close() }()

	var removed uint
	if dirtyVersion < 0 {
		removed, err = source.First()
	} else {
		removed, err = source.Next(uint(dirtyVersion))
	}
	if err != nil {
		return "a down migration"
	}
	return schemaFileName(removed, "down")
}

// schemaFileName finds the embedded file of version in direction ("up" or "down"); it falls back to the bare
// version number.
func schemaFileName(version uint, direction string) string {
	entries, err := fs.ReadDir(FS, ".")
	if err == nil {
		for _, entry := range entries {
			digits, _, ok := strings.Cut(entry.Name(), "_")
			v, perr := strconv.ParseUint(digits, 10, 64)
			if ok && perr == nil && uint(v) == version && strings.HasSuffix(entry.Name(), "."+direction+".sql") {
				return entry.Name()
			}
		}
	}
	return fmt.Sprintf("version %d", version)
}

// rowQuerier is what schemaVersion needs of a pool or a connection.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// schemaVersion reads MigrationsTable without creating it: the recorded version (-1 when none, as golang-migrate
// records it) and whether it is dirty.
func schemaVersion(ctx context.Context, q rowQuerier) (version int64, dirty bool, err error) {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT pg_catalog.to_regclass($1) IS NOT NULL",
		migrationsSchema+"."+MigrationsTable).Scan(&exists); err != nil {
		return 0, false, fmt.Errorf("look for %s: %w", MigrationsTable, err)
	}
	if !exists {
		return -1, false, nil
	}

	err = q.QueryRow(ctx, "SELECT version, dirty FROM "+
		pgx.Identifier{migrationsSchema, MigrationsTable}.Sanitize()+" LIMIT 1").Scan(&version, &dirty)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return -1, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("read %s: %w", MigrationsTable, err)
	}
	return version, dirty, nil
}

// latestSchemaVersion is the highest version among the embedded migration files.
func latestSchemaVersion() (uint, error) {
	source, err := iofs.New(FS, ".")
	if err != nil {
		return 0, fmt.Errorf("read embedded migrations: %w", err)
	}
	defer func() { _ = source.Close() }()

	version, err := source.First()
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		return 0, fmt.Errorf("read embedded migrations: %w", err)
	}
	for {
		next, err := source.Next(version)
		if errors.Is(err, fs.ErrNotExist) {
			return version, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read embedded migrations: %w", err)
		}
		version = next
	}
}

// applySQL applies every file of package sql in one transaction, serialized against other migrators by a
// transaction advisory lock. Each file may hold several statements, so it is sent with the simple query protocol
// (Exec without arguments).
func applySQL(ctx context.Context, databaseURL string, logger *slog.Logger) error {
	files, err := stepreadysql.Files()
	if err != nil {
		return fmt.Errorf("functions and triggers: %w", err)
	}
	digest, err := stepreadysql.Digest()
	if err != nil {
		return fmt.Errorf("functions and triggers: %w", err)
	}

	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("functions and triggers: connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()

	start := time.Now()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", sqlApplyLockKey); err != nil {
			return fmt.Errorf("functions and triggers: take advisory lock: %w", err)
		}
		for _, file := range files {
			if _, err := tx.Exec(ctx, file.Contents); err != nil {
				return fmt.Errorf("sql/%s%s: %w", file.Name, errorLine(file.Contents, err), err)
			}
		}
		// Which build's functions these are: Check compares it with the running binary's.
		if _, err := tx.Exec(ctx, "COMMENT ON SCHEMA stepready IS "+quoteLiteral(digestComment+digest)); err != nil {
			return fmt.Errorf("functions and triggers: record their digest: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	logger.InfoContext(ctx, "migrations: applied functions and triggers",
		slog.Int("files", len(files)), slog.Duration("duration", time.Since(start)))
	return nil
}

// errorLine returns ", line N" for a Postgres error that carries a position within contents, else "".
func errorLine(contents string, err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Position <= 0 {
		return ""
	}
	// Position counts characters, not bytes, from 1.
	line, pos := 1, int(pgErr.Position)
	for _, r := range contents {
		pos--
		if pos <= 0 {
			break
		}
		if r == '\n' {
			line++
		}
	}
	return fmt.Sprintf(", line %d", line)
}

// riverMigrate runs River's migrations fully up, or fully down (TargetVersion -1 removes every River table),
// holding riverLockKey so that concurrent migrators take turns: rivermigrate itself takes no lock.
func riverMigrate(ctx context.Context, databaseURL string, logger *slog.Logger, direction rivermigrate.Direction) error {
	pool, err := openPool(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return fmt.Errorf("create migrator: %w", err)
	}

	opts := &rivermigrate.MigrateOpts{}
	if direction == rivermigrate.DirectionDown {
		opts.TargetVersion = -1
	}

	return withSessionLock(ctx, pool, riverLockKey, func() error {
		res, err := migrator.Migrate(ctx, direction, opts)
		if err != nil {
			return err
		}
		versions := make([]int, 0, len(res.Versions))
		for _, v := range res.Versions {
			versions = append(versions, v.Version)
		}
		logger.InfoContext(ctx, "migrations: river migrated",
			slog.String("direction", string(direction)), slog.Any("versions", versions))
		return nil
	})
}

// withSessionLock runs fn while one connection of pool holds the session advisory lock key. The lock is released
// even when ctx is cancelled; if releasing fails, that connection is closed, which releases it too.
func withSessionLock(ctx context.Context, pool *pgxpool.Pool, key int64, fn func() error) (err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire lock connection: %w", err)
	}
	defer conn.Release()

	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return fmt.Errorf("take advisory lock: %w", err)
	}
	defer func() {
		unlockCtx := context.WithoutCancel(ctx)
		if _, unlockErr := conn.Exec(unlockCtx, "SELECT pg_advisory_unlock($1)", key); unlockErr != nil {
			_ = conn.Conn().Close(unlockCtx)
			err = errors.Join(err, fmt.Errorf("release advisory lock: %w", unlockErr))
		}
	}()

	return fn()
}

// openPool opens a pool on databaseURL and checks that the server answers.
func openPool(ctx context.Context, databaseURL string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return pool, nil
}

// migrateLogger adapts slog to golang-migrate's Logger.
type migrateLogger struct {
	ctx    context.Context
	logger *slog.Logger
}

// Printf logs one line of golang-migrate progress ("1/u schema (12ms)") at info level.
func (l migrateLogger) Printf(format string, v ...any) {
	l.logger.InfoContext(l.ctx, "migrations: golang-migrate: "+strings.TrimSpace(fmt.Sprintf(format, v...)))
}

// Verbose reports that golang-migrate's per-file read/run timings are not wanted.
func (l migrateLogger) Verbose() bool { return false }

// orDiscard returns logger, or a logger that drops everything when it is nil.
func orDiscard(logger *slog.Logger) *slog.Logger {
	if logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return logger
}

// Compile-time check that the logger adapter satisfies golang-migrate's interface.
var _ migrate.Logger = migrateLogger{}
