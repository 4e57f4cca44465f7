package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Cluster is a running local PostgreSQL server. StartThrowaway and StartPersistent make one; Stop ends it.
type Cluster struct {
	// URL is the postgres:// URL of the cluster's main database as the superuser postgres (trust
	// authentication, TCP on 127.0.0.1): the maintenance database postgres for a throwaway cluster, the
	// database stepready for a persistent one.
	URL string

	// Port is the server's TCP port on 127.0.0.1.
	Port int

	// Dir is the cluster's directory: the temporary directory of a throwaway cluster, the directory given to
	// StartPersistent for a persistent one.
	Dir string

	// DataDir is the data directory (PGDATA). It also holds the server's Unix sockets.
	DataDir string

	// Started is true when this call started the server, false when a running persistent server was reused.
	Started bool

	persistent bool
	bin        binDir
	cred       *syscall.Credential
	logger     *slog.Logger

	// Throwaway clusters only: the postgres child process, and its settings for Restart.
	settings, env []string
	cmd           *exec.Cmd
	exited        chan struct{} // closed once cmd has been waited for
	logf          *os.File

	stopOnce sync.Once
	stopErr  error
}

// DatabaseURL returns the URL of database name on the cluster, as the superuser postgres.
func (c *Cluster) DatabaseURL(name string) string { return serverURL(c.Port, name) }

// Stop ends the cluster; it is idempotent. A throwaway cluster's server is shut down and its directory deleted.
// A persistent cluster's server is shut down with `pg_ctl stop -m fast` unless other clients are connected to
// it; its data stays. ctx bounds the wait for a persistent server's shutdown.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		if c.persistent {
			c.stopErr = c.stopPersistent(ctx)
			return
		}
		c.stopErr = c.stopThrowaway()
	})
	return c.stopErr
}

const (
	// throwawayDirPrefix starts the name of every throwaway cluster directory in the temporary directory.
	throwawayDirPrefix = "stepready-pgcluster-"

	// ownerFile, in a throwaway cluster directory, holds the process id of the process that made it.
	ownerFile = "owner.pid"

	// readyTimeout bounds the wait for a started server to accept connections.
	readyTimeout = time.Minute
)

// FastSettings make a cluster fast at the expense of crash safety, which a test database does not need, and let
// many parallel tests connect. Pass them in ThrowawayOptions.Settings (and to a test container).
var FastSettings = []string{
	"fsync=off",
	"synchronous_commit=off",
	"full_page_writes=off",
	"max_connections=300",
	"checkpoint_timeout=1h",
	"max_wal_size=4GB",
}

// DefaultSettings leave the server's own defaults in place (crash safety: fsync, synchronous_commit, full page
// writes; JIT; autovacuum) and only let as many clients connect as FastSettings does: a stock server, for the
// benchmarks' "server defaults" profile.
var DefaultSettings = []string{
	"max_connections=300",
}

// ThrowawayOptions configure StartThrowaway.
type ThrowawayOptions struct {
	// Settings are server settings (name=value) passed to postgres with -c, such as FastSettings.
	Settings []string
	// Logger receives progress messages (nil: discarded).
	Logger *slog.Logger
	// Env is added to the server process's environment (NAME=value), for example to run it under libfaketime
	// in the clock-skew tests.
	Env []string
}

// StartThrowaway initialises a cluster in a new temporary directory with the newest local PostgreSQL binaries
// and starts its server as a child process. Stop (or the death of this process) ends the server; Stop also
// deletes the directory.
func StartThrowaway(ctx context.Context, opts ThrowawayOptions) (_ *Cluster, err error) {
	logger := orDiscard(opts.Logger)
	bin, err := newestBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}

	removeAbandonedThrowaways()
	dir, err := os.MkdirTemp("", throwawayDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, fmt.Errorf("write cluster owner: %w", err)
	}
	// The server user must own the tree; the parent (the temporary directory) lets it in.
	if err := chownTo(dir, cred); err != nil {
		return nil, err
	}
	dataDir := filepath.Join(dir, "data")

	logger.Debug("pgcluster: initialising a throwaway cluster", slog.String("dir", dir), slog.String("bin", bin.dir))
	if err := initdb(ctx, bin, cred, dir, dataDir); err != nil {
		return nil, err
	}

	logf, err := os.OpenFile(filepath.Join(dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create server log: %w", err)
	}
	defer func() {
		if err != nil {
			_ = logf.Close()
		}
	}()

	// The free port is found by binding and releasing it, so another process may take it first: try again.
	var lastErr error
	for range 3 {
		c := &Cluster{Dir: dir, DataDir: dataDir, Started: true, bin: bin, cred: cred, logger: logger, logf: logf,
			settings: opts.Settings, env: opts.Env}
		err := c.startChild(ctx, 0)
		if err == nil {
			logger.Debug("pgcluster: throwaway cluster running", slog.Int("port", c.Port))
			return c, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	logTail, _ := os.ReadFile(logf.Name())
	return nil, fmt.Errorf("%w\nserver log:\n%s", lastErr, tail(logTail, 4000))
}

// initdb creates the data directory dataDir (as the server user, from dir).
func initdb(ctx context.Context, bin binDir, cred *syscall.Credential, dir, dataDir string) error {
	// dir is the working directory: the server user may not be allowed into this process's one.
	return runAs(ctx, cred, dir, bin.path("initdb"),
		"--pgdata", dataDir, "--username", "postgres", "--auth", "trust",
		"--encoding", "UTF8", "--locale", "C", "--no-sync", "--no-instructions")
}

// CrashStop ends a throwaway cluster's server at once, as `pg_ctl stop -m immediate` does (SIGQUIT: every
// session dropped, no checkpoint; the next start runs crash recovery), and waits until it has exited. For tests
// of what survives a database crash; Restart starts it again.
func (c *Cluster) CrashStop() error {
	if c.persistent || c.cmd == nil {
		return errors.New("pgcluster: CrashStop is for throwaway clusters")
	}
	_ = c.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-c.exited:
		return nil
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return nil
	}
}

// Restart starts a throwaway cluster's server again after CrashStop, on the same port and with the same
// settings, and waits until it accepts connections.
func (c *Cluster) Restart(ctx context.Context) error {
	if c.persistent || c.cmd == nil {
		return errors.New("pgcluster: Restart is for throwaway clusters")
	}
	select {
	case <-c.exited:
	default:
		return errors.New("pgcluster: Restart: the server is still running")
	}
	return c.startChild(ctx, c.Port)
}

// startChild starts postgres on port (0: a free one) as a child process and waits until it accepts
// connections.
func (c *Cluster) startChild(ctx context.Context, port int) error {
	settings, env := c.settings, c.env
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return err
		}
	}

	args := []string{"-D", c.DataDir, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + c.DataDir}
	for _, setting := range settings {
		args = append(args, "-c", setting)
	}
	cmd := exec.Command(c.bin.path("postgres"), args...)
	cmd.Dir = c.Dir
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = c.logf, c.logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: c.cred,
		// If this process dies without stopping the server, the server shuts down immediately (SIGQUIT) rather
		// than outliving it.
		Pdeathsig: syscall.SIGQUIT,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}

	c.Port, c.URL = port, serverURL(port, "postgres")
	c.cmd, c.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()

	readyCtx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := waitReady(readyCtx, c.URL, c.exited); err != nil {
		c.shutdownChild()
		return fmt.Errorf("start postgres on port %d: %w", port, err)
	}
	return nil
}

// stopThrowaway shuts the server down and removes the cluster's directory.
func (c *Cluster) stopThrowaway() error {
	c.shutdownChild()
	errs := []error{c.logf.Close()}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove cluster directory: %w", err))
	}
	return errors.Join(errs...)
}

// shutdownChild asks the server for a fast shutdown (SIGINT: disconnect everyone, no waiting), escalating to
// an immediate shutdown (SIGQUIT) and then SIGKILL if it takes too long, and waits until it has exited.
func (c *Cluster) shutdownChild() {
	for _, step := range []struct {
		signal syscall.Signal
		wait   time.Duration
	}{{syscall.SIGINT, 30 * time.Second}, {syscall.SIGQUIT, 10 * time.Second}, {syscall.SIGKILL, time.Minute}} {
		_ = c.cmd.Process.Signal(step.signal)
		select {
		case <-c.exited:
			return
		case <-time.After(step.wait):
		}
	}
}

// removeAbandonedThrowaways deletes the throwaway cluster directories of processes that died without cleaning up
// (a test binary killed by -timeout, say): their owner process is gone and so is the server (its
// postmaster.pid names no live process). Anything that cannot be read is left alone.
func removeAbandonedThrowaways() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), throwawayDirPrefix+"*"))
	for _, dir := range dirs {
		owner, err := readPid(filepath.Join(dir, ownerFile))
		if err != nil || processAlive(owner) {
			continue
		}
		if server, err := readPid(filepath.Join(dir, "data", "postmaster.pid")); err == nil && processAlive(server) {
			continue
		}
		_ = os.RemoveAll(dir)
	}
}

func orDiscard(logger *slog.Logger) *slog.Logger {
	if logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return logger
}
