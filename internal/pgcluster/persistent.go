package pgcluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DatabaseName is the database StartPersistent creates (when missing) and returns the URL of.
const DatabaseName = "stepready"

const (
	// stateFile, in a persistent cluster's directory, records where its data directory is and its last port.
	stateFile = "cluster.json"

	// lockFile, in a persistent cluster's directory, serialises concurrent StartPersistent calls (flock).
	lockFile = ".lock"

	// fallbackPrefix names the directory under /var/tmp used when the server user cannot enter the directory.
	fallbackPrefix = "stepready-cluster-"

	// reuseTimeout bounds the wait for a running server (one that is still starting up, say) to accept
	// connections before StartPersistent gives up on it.
	reuseTimeout = 15 * time.Second

	// pgCtlTimeout is pg_ctl's own wait limit, in seconds, for a start or stop.
	pgCtlTimeout = "60"

	// lingerTimeout is how long Stop waits for the sessions of pools that were just closed to end before it
	// concludes that other clients use the server.
	lingerTimeout = 2 * time.Second
)

// state is the content of cluster.json.
type state struct {
	// DataDir is the absolute path of the data directory (DIR/data, or the fallback under /var/tmp).
	DataDir string `json:"data_dir"`
	// Port is the server's port when it last ran; the next start reuses it when it is free.
	Port int `json:"port"`
}

// StartPersistent starts, or reuses, the persistent cluster kept in dir, and returns it with URL set to the
// database stepready (created when missing).
//
// On first use it runs initdb (dir is created when missing). Afterwards it reuses the data: a server that is
// already running is reused as is (Started is false); a stopped one is started with pg_ctl on the port recorded
// in dir/cluster.json when that port is free, else on a new free port. The server is not a child of this
// process: it keeps running if this process dies, and the next StartPersistent reuses it. Call Stop to shut it
// down when done. Concurrent calls on one directory take turns (an flock on dir/.lock).
func StartPersistent(ctx context.Context, dir string, logger *slog.Logger) (*Cluster, error) {
	logger = orDiscard(logger)
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pgcluster: create %s: %w", dir, err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	c, err := startPersistent(ctx, dir, logger)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: local cluster in %s: %w", dir, err)
	}
	return c, nil
}

func startPersistent(ctx context.Context, dir string, logger *slog.Logger) (*Cluster, error) {
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	st, err := readState(dir)
	if err != nil {
		return nil, err
	}
	c := &Cluster{persistent: true, Dir: dir, DataDir: st.DataDir, cred: cred, logger: logger}

	if c.DataDir == "" {
		newest, err := newestBinDir()
		if err != nil {
			return nil, err
		}
		base := dir
		if !canEnter(newest.path("postgres"), dir, cred) {
			if base, err = fallbackBase(dir); err != nil {
				return nil, err
			}
			logger.Info("pgcluster: the server user cannot enter the directory; keeping the data elsewhere",
				slog.String("dir", dir), slog.String("data_dir", filepath.Join(base, "data")))
		}
		c.DataDir = filepath.Join(base, "data")
	}
	logFile := filepath.Join(filepath.Dir(c.DataDir), "postgres.log")

	version, err := os.ReadFile(filepath.Join(c.DataDir, "PG_VERSION"))
	switch {
	case err == nil:
		major, convErr := strconv.Atoi(strings.TrimSpace(string(version)))
		if convErr != nil {
			return nil, fmt.Errorf("unreadable %s: %q", filepath.Join(c.DataDir, "PG_VERSION"), version)
		}
		if c.bin, err = binDirForMajor(major); err != nil {
			return nil, fmt.Errorf("the data directory %s was made by PostgreSQL %d: %w; remove %s to start afresh",
				c.DataDir, major, err, dir)
		}
	case errors.Is(err, fs.ErrNotExist):
		if c.bin, err = newestBinDir(); err != nil {
			return nil, err
		}
		logger.Info("pgcluster: initialising a new cluster", slog.String("data_dir", c.DataDir),
			slog.Int("postgres", c.bin.major))
		if err := c.initialise(ctx, logFile); err != nil {
			return nil, err
		}
	default:
		return nil, err
	}
	st.DataDir = c.DataDir

	port, running, err := c.runningPort(ctx)
	if err != nil {
		return nil, err
	}
	if running {
		c.Port = port
		logger.Info("pgcluster: reusing the running server", slog.Int("port", port), slog.String("data_dir", c.DataDir))
	} else {
		if err := c.startServer(ctx, st.Port, logFile); err != nil {
			return nil, err
		}
		c.Started = true
		logger.Info("pgcluster: server started", slog.Int("port", c.Port), slog.String("data_dir", c.DataDir))
	}
	st.Port = c.Port
	if err := writeState(dir, st); err != nil {
		return nil, err
	}

	if err := ensureDatabase(ctx, c.DatabaseURL("postgres"), DatabaseName); err != nil {
		return nil, err
	}
	c.URL = c.DatabaseURL(DatabaseName)
	return c, nil
}

// initialise creates the data directory and the log file, owned by the server user, and runs initdb.
func (c *Cluster) initialise(ctx context.Context, logFile string) error {
	base := filepath.Dir(c.DataDir)
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	// An existing, empty data directory is fine (initdb fills it); a non-empty one makes initdb refuse.
	if err := os.Mkdir(c.DataDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := chownTo(c.DataDir, c.cred); err != nil {
		return err
	}
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("create server log: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := chownTo(logFile, c.cred); err != nil {
		return err
	}
	return runAs(ctx, c.cred, base, c.bin.path("initdb"),
		"--pgdata", c.DataDir, "--username", "postgres", "--auth", "trust",
		"--encoding", "UTF8", "--locale", "C", "--no-instructions")
}

// runningPort reports whether a server already runs on the data directory and, if so, its port: postmaster.pid
// names a live postgres process and the server accepts connections on the port recorded there.
func (c *Cluster) runningPort(ctx context.Context) (int, bool, error) {
	pidFile := filepath.Join(c.DataDir, "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	// postmaster.pid: pid, data directory, start time, port, socket directory, listen address, …
	lines := strings.Split(string(b), "\n")
	pid, pidErr := strconv.Atoi(strings.TrimSpace(lines[0]))
	if pidErr != nil || !processAlive(pid) {
		return 0, false, nil // stale: postgres replaces it when it starts
	}
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil {
		if name := strings.TrimSpace(string(comm)); name != "postgres" && name != "postmaster" {
			// A leftover from before a reboot whose pid now belongs to another program: postgres would refuse to
			// start over it, so remove it.
			c.logger.Info("pgcluster: removing a stale postmaster.pid", slog.Int("pid", pid), slog.String("process", name))
			return 0, false, os.Remove(pidFile)
		}
	}
	if len(lines) < 4 {
		return 0, false, fmt.Errorf("a server (pid %d) is starting on %s; try again in a moment", pid, c.DataDir)
	}
	port, err := strconv.Atoi(strings.TrimSpace(lines[3]))
	if err != nil {
		return 0, false, fmt.Errorf("unreadable port in %s: %q", pidFile, lines[3])
	}
	readyCtx, cancel := context.WithTimeout(ctx, reuseTimeout)
	defer cancel()
	if err := waitReady(readyCtx, serverURL(port, "postgres"), nil); err != nil {
		return 0, false, fmt.Errorf("a server (pid %d) runs on %s but does not accept connections on port %d: %w; "+
			"stop it with pg_ctl stop -D %s", pid, c.DataDir, port, err, c.DataDir)
	}
	return port, true, nil
}

// startServer starts the server with pg_ctl on port (when free; else on a new free port) and waits until it
// accepts connections.
func (c *Cluster) startServer(ctx context.Context, port int, logFile string) error {
	var lastErr error
	for attempt := range 3 {
		if attempt > 0 || !portFree(port) {
			var err error
			if port, err = freePort(); err != nil {
				return err
			}
		}
		// pg_ctl hands -o to a shell: quote the path.
		opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s",
			port, shellQuote(c.DataDir))
		err := runAs(ctx, c.cred, filepath.Dir(c.DataDir), c.bin.path("pg_ctl"), "start",
			"--pgdata", c.DataDir, "--log", logFile, "--wait", "--timeout", pgCtlTimeout, "--silent", "-o", opts)
		if err == nil {
			readyCtx, cancel := context.WithTimeout(ctx, readyTimeout)
			err = waitReady(readyCtx, serverURL(port, "postgres"), nil)
			cancel()
			if err == nil {
				c.Port = port
				return nil
			}
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	logTail, _ := os.ReadFile(logFile)
	return fmt.Errorf("start the server: %w\nserver log (%s):\n%s", lastErr, logFile, tail(logTail, 4000))
}

// stopPersistent shuts the server down unless other clients are connected to it.
func (c *Cluster) stopPersistent(ctx context.Context) error {
	others, err := c.otherSessions(ctx)
	if err != nil {
		// Not reachable: it is stopped already, or stopping.
		c.logger.Debug("pgcluster: server not reachable at stop", slog.Any("error", err))
	}
	if others > 0 {
		c.logger.Info("pgcluster: leaving the server running: other clients are connected",
			slog.Int("sessions", others), slog.Int("port", c.Port))
		return nil
	}
	err = runAs(ctx, c.cred, filepath.Dir(c.DataDir), c.bin.path("pg_ctl"), "stop",
		"--pgdata", c.DataDir, "--mode", "fast", "--wait", "--timeout", pgCtlTimeout, "--silent")
	if err != nil {
		if _, statErr := os.Stat(filepath.Join(c.DataDir, "postmaster.pid")); errors.Is(statErr, fs.ErrNotExist) {
			return nil // someone else stopped it
		}
		return fmt.Errorf("pgcluster: stop the server of %s: %w", c.Dir, err)
	}
	c.logger.Info("pgcluster: server stopped", slog.String("data_dir", c.DataDir))
	return nil
}

// otherSessions counts the client sessions on the server other than the one asking. Sessions of pools closed a
// moment ago may take a little while to end, so a non-zero count is checked again for up to lingerTimeout.
func (c *Cluster) otherSessions(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, lingerTimeout+5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DatabaseURL("postgres"))
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()

	deadline := time.Now().Add(lingerTimeout)
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_catalog.pg_backend_pid()`).Scan(&n)
		if err != nil || n == 0 || time.Now().After(deadline) {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ensureDatabase creates database name on the server of adminURL unless it exists.
func ensureDatabase(ctx context.Context, adminURL, name string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_catalog.pg_database WHERE datname = $1)", name).
		Scan(&exists); err != nil {
		return fmt.Errorf("look for database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: made by a concurrent caller
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// fallbackBase returns (and creates) the directory under /var/tmp that holds the cluster of dir when the server
// user cannot enter dir. Its name is derived from dir, so the same directory always maps to the same place.
func fallbackBase(dir string) (string, error) {
	root := "/var/tmp"
	if info, err := os.Stat(root); err != nil || !info.IsDir() {
		root = os.TempDir()
	}
	sum := sha256.Sum256([]byte(dir))
	base := filepath.Join(root, fallbackPrefix+hex.EncodeToString(sum[:6]))
	if err := os.Mkdir(base, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	// The name is predictable in a world-writable directory: accept only a real directory of our own.
	info, err := os.Lstat(base)
	if err != nil {
		return "", err
	}
	stat, ok := info.Sys().(*syscall.Stat_t)
	if !info.IsDir() || !ok || int(stat.Uid) != os.Geteuid() {
		return "", fmt.Errorf("%s exists but is not a directory owned by this user; remove it", base)
	}
	return base, nil
}

// readState reads dir/cluster.json; a missing file is an empty state.
func readState(dir string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("unreadable %s (remove it to start afresh): %w", filepath.Join(dir, stateFile), err)
	}
	return st, nil
}

// writeState writes dir/cluster.json atomically.
func writeState(dir string, st state) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, stateFile))
}

// lockDir takes an exclusive flock on dir/.lock; the returned function releases it.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("pgcluster: lock %s: %w", f.Name(), err)
	}
	return func() { _ = f.Close() }, nil // closing the file releases the lock
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	var b bytes.Buffer
	b.WriteByte('\'')
	b.WriteString(strings.ReplaceAll(s, "'", `'\''`))
	b.WriteByte('\'')
	return b.String()
}
