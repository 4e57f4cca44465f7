// Package pgtest gives every test its own freshly migrated PostgreSQL database, fast.
//
// Use it from any package's tests:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		db := pgtest.New(t)
//		_, err := db.Pool.Exec(ctx, "SELECT stepready.retry_eligible(0, 0, false)")
//		...
//	}
//
// # Which server
//
// The first New of a test process picks one PostgreSQL server for the whole process, in this order:
//
//  1. TEST_DATABASE_URL, when set: a postgres:// URL of a role with the CREATEDB privilege (the databases are
//     created and dropped there; nothing else on that server is touched).
//  2. A testcontainers-go PostgreSQL container, when a Docker engine answers a ping within about 2 s.
//     PGTEST_NO_DOCKER=1 skips this step.
//  3. A throwaway cluster (internal/pgcluster) made with the local initdb and postgres (found in PATH or
//     /usr/lib/postgresql/*/bin, newest major version first), listening on 127.0.0.1 on a free port, tuned for
//     speed (fsync, synchronous commit and full page writes off: its data does not survive a crash, and need
//     not). When the tests run as root, the cluster runs as the postgres system user (else nobody), because
//     PostgreSQL refuses root.
//
// Then it creates the template database stepready_template_<random> and migrates it once with migrations.Up.
// Every New clones that template with CREATE DATABASE … TEMPLATE, which takes milliseconds, and drops the clone
// when the test ends. Main removes the template, stops the container or cluster and deletes its files after
// the last test, and then checks that no goroutine leaked.
//
// Pools and connections made here set search_path to the empty string, so a test fails if any SQL function
// or query relies on the search path instead of naming the stepready schema.
//
// PgBouncer puts a PgBouncer in transaction pooling mode in front of the server, for tests of stepready behind a
// connection pooler; they skip without the pgbouncer program, and fail when CI=true.
package pgtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

// DB is one database that belongs to one test. New and NewEmpty create it; it is dropped when the test ends.
type DB struct {
	// Pool is a pool on the database with an empty search_path, closed when the test ends.
	Pool *pgxpool.Pool

	// URL is the postgres:// URL of the database, for code under test that opens its own connections (the
	// migrator, a daemon). It sets no search_path: such connections get the server's default.
	URL string

	// Name is the database name, stepready_test_<random>.
	Name string
}

// PoolOption adjusts the configuration of a pool made by DB.NewPool before the pool is opened.
type PoolOption func(*pgxpool.Config)

// MaxConns limits the pool to n connections (pgxpool's default is the larger of 4 and the number of CPUs).
func MaxConns(n int32) PoolOption {
	return func(config *pgxpool.Config) { config.MaxConns = n }
}

// New returns a fresh database of its own for t, migrated to the newest schema (a clone of the template that
// was migrated once per test process), with an open Pool. The database is dropped, and its pools and
// connections are closed, when t ends. It fails t when no server can be had; the first call of a process pays
// for starting the server and migrating the template.
//
// The test process must run its tests through Main (see the package documentation); New fails t otherwise.
func New(t testing.TB) *DB {
	t.Helper()
	return getServer(t).newDatabase(t, templateOf)
}

// NewEmpty is New without migrations: the database is a copy of template0, for tests of the migrator itself.
func NewEmpty(t testing.TB) *DB {
	t.Helper()
	return getServer(t).newDatabase(t, templateEmpty)
}

// NewPool opens an additional pool on db with an empty search_path, adjusted by opts, and closes it when t
// ends. Use it for a pool with other limits (MaxConns) or to simulate a second process.
func (db *DB) NewPool(t testing.TB, opts ...PoolOption) *pgxpool.Pool {
	t.Helper()

	config, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("pgtest: parse pool config: %v", err)
	}
	config.ConnConfig.RuntimeParams["search_path"] = ""
	for _, opt := range opts {
		opt(config)
	}

	ctx, cancel := context.WithTimeout(context.Background(), operationTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		t.Fatalf("pgtest: open pool on %s: %v", db.Name, err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("pgtest: connect to %s: %v", db.Name, err)
	}
	return pool
}

// LoginRole creates a LOGIN role that is a member of group only (for example stepready_worker, one of the roles
// `migrate up` creates, SPEC §17; "" for none: a role with PUBLIC's rights only) and returns db's URL with that
// user, for code under test that must run with exactly that role's rights. The role is named after the database (roles are cluster-wide: parallel tests
// must not share one) and dropped when t ends. Its password is not needed: the throwaway cluster trusts local
// connections (with TEST_DATABASE_URL, the server's own authentication applies).
func (db *DB) LoginRole(t testing.TB, group string) string {
	t.Helper()
	role := db.Name + "_" + cmp.Or(strings.TrimPrefix(group, "stepready_"), "nobody")
	ctx, cancel := context.WithTimeout(context.Background(), operationTimeout)
	defer cancel()
	create := "CREATE ROLE " + pgx.Identifier{role}.Sanitize() + " LOGIN"
	if group != "" {
		create += " IN ROLE " + pgx.Identifier{group}.Sanitize()
	}
	if _, err := db.Pool.Exec(ctx, create); err != nil {
		t.Fatalf("pgtest: create role %s in %s: %v", role, group, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), operationTimeout)
		defer cancel()
		// Its sessions first, so that nothing of the role outlives the test.
		_, _ = getServer(t).admin.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
			WHERE usename = $1`, role)
		if _, err := getServer(t).admin.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Errorf("pgtest: drop role %s: %v", role, err)
		}
	})
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", db.URL, err)
	}
	u.User = url.User(role)
	return u.String()
}

// Conn opens a single dedicated connection on db with an empty search_path and closes it when t ends. Use it
// for LISTEN, session advisory locks or anything else bound to one session.
func (db *DB) Conn(t testing.TB) *pgx.Conn {
	t.Helper()

	config, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("pgtest: parse connection config: %v", err)
	}
	config.RuntimeParams["search_path"] = ""

	ctx, cancel := context.WithTimeout(context.Background(), operationTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", db.Name, err)
	}
	t.Cleanup(func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), operationTimeout)
		defer cancel()
		_ = conn.Close(closeCtx)
	})
	return conn
}

// Main runs the tests of a package whose tests use pgtest, then drops the template database, stops the server
// it started and removes its files, and, when every test passed, fails the run if goroutines leaked (as
// goleak.VerifyTestMain would). It returns the exit code for os.Exit:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
func Main(m *testing.M) int {
	mainRunning.Store(true)
	code := m.Run()
	mainRunning.Store(false)

	leakOpts, err := shutdown()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: shut down the test server: %v\n", err)
		if code == 0 {
			code = 1
		}
	}

	if code == 0 {
		if err := goleak.Find(leakOpts...); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: goroutines leaked by the tests: %v\n", err)
			code = 1
		}
	}
	return code
}

const (
	// operationTimeout bounds one administrative operation of a test: creating or dropping its database,
	// opening a pool or a connection.
	operationTimeout = time.Minute

	// setupTimeout bounds picking and starting the server and migrating the template.
	setupTimeout = 5 * time.Minute

	// cloneRetryFor is how long a clone retries while the template still has a connection (SQLSTATE 55006,
	// "source database is being accessed by other users"): the migrator's connections may take a moment to end
	// after it closed them.
	cloneRetryFor = 10 * time.Second
)

// Templates a test database can be made from: the migrated template of this process, or an empty one.
const (
	templateOf    = ""
	templateEmpty = "template0"
)

var (
	// mainRunning is true while Main runs the tests; New refuses to start a server nobody would stop.
	mainRunning atomic.Bool

	serverMu  sync.Mutex
	theServer *server
	serverErr error
)

// getServer returns the server of this process, picking and starting it on the first call.
func getServer(t testing.TB) *server {
	t.Helper()
	if !mainRunning.Load() {
		t.Fatal("pgtest: run the tests through pgtest.Main: func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }")
	}

	serverMu.Lock()
	defer serverMu.Unlock()
	if theServer == nil && serverErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		theServer, serverErr = startServer(ctx)
		cancel()
	}
	if serverErr != nil {
		t.Fatalf("pgtest: %v", serverErr)
	}
	return theServer
}

// shutdown stops the server of this process, if one was started, and returns the goleak options it needs.
func shutdown() ([]goleak.Option, error) {
	serverMu.Lock()
	defer serverMu.Unlock()
	if theServer == nil {
		return nil, nil
	}
	s := theServer
	theServer, serverErr = nil, errors.New("the test server is shut down")
	return s.leakOptions, s.close()
}

// newDatabase creates a database for t from template (templateOf: the migrated template) and drops it at t's
// cleanup.
func (s *server) newDatabase(t testing.TB, template string) *DB {
	t.Helper()
	if template == templateOf {
		template = s.template
	}

	name := "stepready_test_" + randomSuffix()
	ctx, cancel := context.WithTimeout(context.Background(), operationTimeout)
	defer cancel()

	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	deadline := time.Now().Add(cloneRetryFor)
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		_, err := s.admin.Exec(ctx, create)
		if err == nil {
			break
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" && time.Now().Before(deadline) {
			time.Sleep(pause)
			continue
		}
		t.Fatalf("pgtest: create database %s from %s: %v", name, template, err)
	}

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), operationTimeout)
		defer cancel()
		if _, err := s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})

	url, err := databaseURL(s.url, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	db := &DB{URL: url, Name: name}
	db.Pool = db.NewPool(t)
	return db
}

// randomSuffix returns 12 random lowercase hex digits for a database name.
func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
