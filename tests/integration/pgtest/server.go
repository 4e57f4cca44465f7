package pgtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/stepready/stepready/internal/pgcluster"
	"github.com/stepready/stepready/migrations"
)

// server is the PostgreSQL server of a test process and the migrated template database on it.
type server struct {
	// kind says where the server came from, for messages.
	kind string

	// url is the URL of the server's maintenance database (postgres), as a role that may create databases.
	url string

	// admin is a pool on url that creates and drops the test databases.
	admin *pgxpool.Pool

	// template is the name of the migrated template database.
	template string

	// stop stops what startServer started (container, cluster) and removes its files; nil for an external
	// server.
	stop func() error

	// leakOptions tell goleak which goroutines belong to the server's machinery rather than to the tests.
	leakOptions []goleak.Option
}

// startServer picks the server (TEST_DATABASE_URL, a container, a local cluster), then creates and migrates the
// template database on it.
func startServer(ctx context.Context) (*server, error) {
	s := &server{}

	switch external := os.Getenv("TEST_DATABASE_URL"); {
	case external != "":
		s.kind, s.url = "TEST_DATABASE_URL", external
	case dockerAvailable(ctx):
		s.kind = "testcontainers"
		container, err := startContainer(ctx)
		if err != nil {
			return nil, fmt.Errorf("start a PostgreSQL container: %w", err)
		}
		s.url, s.stop = container.url, container.terminate
		s.leakOptions = container.leakOptions
	default:
		s.kind = "local cluster"
		cluster, err := pgcluster.StartThrowaway(ctx, pgcluster.ThrowawayOptions{Settings: serverSettings()})
		if err != nil {
			return nil, fmt.Errorf("no PostgreSQL server for the tests: TEST_DATABASE_URL is not set, "+
				"no Docker engine answered, and a local cluster could not be started: %w", err)
		}
		s.url = cluster.URL
		s.stop = func() error { return cluster.Stop(context.Background()) }
	}

	if err := s.prepare(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("%s: %w", s.kind, err), s.close())
	}
	return s, nil
}

// prepare connects the admin pool, then creates and migrates the template database.
func (s *server) prepare(ctx context.Context) error {
	if _, err := databaseURL(s.url, "postgres"); err != nil {
		return err
	}

	admin, err := pgxpool.New(ctx, s.url)
	if err != nil {
		return fmt.Errorf("open admin pool: %w", err)
	}
	s.admin = admin
	if err := admin.Ping(ctx); err != nil {
		return fmt.Errorf("connect: %w", err)
	}

	name := "stepready_template_" + randomSuffix()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create template database (the role needs CREATEDB): %w", err)
	}
	s.template = name

	templateURL, err := databaseURL(s.url, name)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := migrations.Up(ctx, templateURL, logger); err != nil {
		return fmt.Errorf("migrate template database %s: %w", name, err)
	}

	// Nobody may connect to the template any more: a stray connection would make every clone fail.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("close template database to connections: %w", err)
	}
	return nil
}

// close drops the template database, closes the admin pool and stops the server. It is called once.
func (s *server) close() error {
	var errs []error
	if s.admin != nil {
		if s.template != "" {
			ctx, cancel := context.WithTimeout(context.Background(), operationTimeout)
			_, err := s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{s.template}.Sanitize()+" WITH (FORCE)")
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("drop template database %s: %w", s.template, err))
			}
		}
		s.admin.Close()
	}
	if s.stop != nil {
		if err := s.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// databaseURL returns serverURL with its database replaced by name. serverURL must be a postgres:// URL; the
// keyword/value form (host=… dbname=…) is not accepted because the database name could not be swapped safely.
func databaseURL(serverURL, name string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", errors.New("the server URL must have the form postgres://user:password@host:port/database")
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// serverSettings are the settings of a server the tests start themselves (a local cluster or a container): the
// fast settings of internal/pgcluster, and pg_stat_statements loaded, so that a test can see what statements run
// inside stepready's functions, and whether any was JIT-compiled (tests/integration/create_tasks_test.go). Its
// overhead is a few microseconds per statement.
func serverSettings() []string {
	return append(append([]string{}, pgcluster.FastSettings...), "shared_preload_libraries=pg_stat_statements")
}
