package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"go.uber.org/goleak"
)

// containerImage is the PostgreSQL image of the container: the oldest version stepready supports.
const containerImage = "postgres:15-alpine"

// dockerPingTimeout bounds the check for a Docker engine, so that machines without one fall back quickly.
const dockerPingTimeout = 2 * time.Second

// postgresContainer is a PostgreSQL server in a container started by testcontainers-go.
type postgresContainer struct {
	// url is the URL of the maintenance database, as the superuser postgres.
	url string

	container *tcpostgres.PostgresContainer

	// leakOptions ignore the goroutines of the Docker client and of testcontainers' reaper, which outlive the
	// tests by design.
	leakOptions []goleak.Option
}

// dockerAvailable reports whether a Docker engine answers a ping within dockerPingTimeout. Without any sign of
// an engine (no DOCKER_HOST, no socket in the usual places, no testcontainers configuration) it answers false at
// once without asking testcontainers, whose discovery would otherwise try every strategy it knows.
// PGTEST_NO_DOCKER=1 turns the check off.
func dockerAvailable(ctx context.Context) bool {
	if os.Getenv("PGTEST_NO_DOCKER") != "" || !dockerConfigured() {
		return false
	}

	ctx, cancel := context.WithTimeout(ctx, dockerPingTimeout)
	defer cancel()

	done := make(chan bool, 1)
	go func() {
		cli, err := testcontainers.NewDockerClientWithOpts(ctx)
		if err != nil {
			done <- false
			return
		}
		defer func() { _ = cli.Close() }()
		_, err = cli.Ping(ctx, client.PingOptions{})
		done <- err == nil
	}()

	// Do not trust every layer below to honour ctx: give up on time regardless.
	select {
	case ok := <-done:
		return ok
	case <-ctx.Done():
		return false
	}
}

// dockerConfigured reports whether anything points at a Docker engine.
func dockerConfigured() bool {
	if os.Getenv("DOCKER_HOST") != "" || os.Getenv("TESTCONTAINERS_DOCKER_SOCKET_OVERRIDE") != "" {
		return true
	}
	paths := []string{"/var/run/docker.sock"}
	if runtimeDir := os.Getenv("XDG_RUNTIME_DIR"); runtimeDir != "" {
		paths = append(paths, filepath.Join(runtimeDir, "docker.sock"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		paths = append(paths,
			filepath.Join(home, ".testcontainers.properties"),
			filepath.Join(home, ".docker", "run", "docker.sock"),
			filepath.Join(home, ".docker", "desktop", "docker.sock"),
			filepath.Join(home, ".docker", "contexts"),
		)
	}
	for _, path := range paths {
		if _, err := os.Stat(path); err == nil {
			return true
		}
	}
	return false
}

// startContainer starts a PostgreSQL container with the same speed settings as the local cluster.
func startContainer(ctx context.Context) (*postgresContainer, error) {
	settings := make([]string, 0, 2*len(serverSettings()))
	for _, setting := range serverSettings() {
		settings = append(settings, "-c", setting)
	}

	ctr, err := tcpostgres.Run(ctx, containerImage,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
		testcontainers.WithCmdArgs(settings...),
	)
	if err != nil {
		return nil, errorsJoinTerminate(err, ctr)
	}

	url, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return nil, errorsJoinTerminate(fmt.Errorf("connection string: %w", err), ctr)
	}

	return &postgresContainer{
		url:       url,
		container: ctr,
		leakOptions: []goleak.Option{
			// Everything running now belongs to the Docker client and the reaper, not to a test.
			goleak.IgnoreCurrent(),
			goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		},
	}, nil
}

// terminate stops and removes the container.
func (c *postgresContainer) terminate() error {
	if err := testcontainers.TerminateContainer(c.container); err != nil {
		return fmt.Errorf("terminate PostgreSQL container: %w", err)
	}
	return nil
}

// errorsJoinTerminate returns err, plus the failure to remove a container that was created nonetheless.
func errorsJoinTerminate(err error, ctr *tcpostgres.PostgresContainer) error {
	if ctr == nil {
		return err
	}
	if termErr := testcontainers.TerminateContainer(ctr); termErr != nil {
		return fmt.Errorf("%w (and removing the container failed: %w)", err, termErr)
	}
	return err
}
