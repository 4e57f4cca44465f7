package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoPgBouncer is returned by StartPgBouncer when no pgbouncer program is installed.
var ErrNoPgBouncer = errors.New("no pgbouncer in PATH or /usr/sbin (install it, e.g. apt-get install pgbouncer)")

// PgBouncerOptions configure StartPgBouncer.
type PgBouncerOptions struct {
	// Upstream is a postgres:// URL of the server PgBouncer forwards to: only its host and port are used, and
	// every database name a client asks for is forwarded to the database of that name there. Required.
	Upstream string
	// Users are the roles that may connect. PgBouncer authenticates no one (auth_type trust) but still wants
	// each user name in its auth file; it logs in to the server with the client's user name and no password.
	// At least one.
	Users []string
	// PoolMode is PgBouncer's pool_mode: "transaction" (the default), "session" or "statement".
	PoolMode string
	// Settings are further [pgbouncer] settings (name=value), such as "default_pool_size=50".
	Settings []string
	// Logger receives progress messages (nil: discarded).
	Logger *slog.Logger
}

// PgBouncer is a running PgBouncer, a child process of this one, listening on 127.0.0.1. StartPgBouncer makes
// one; Stop ends it.
type PgBouncer struct {
	// Port is PgBouncer's TCP port on 127.0.0.1.
	Port int
	// Dir holds its configuration, its auth file and its log.
	Dir string

	cmd      *exec.Cmd
	exited   chan struct{}
	logf     *os.File
	stopOnce sync.Once
	stopErr  error
}

// pgbouncerDirPrefix starts the name of every PgBouncer directory in the temporary directory.
const pgbouncerDirPrefix = "stepready-pgbouncer-"

// StartPgBouncer starts PgBouncer in front of opts.Upstream, in transaction pooling mode unless opts say
// otherwise, and waits until it accepts connections. It runs as a child process that dies with this one
// (parent-death signal); when this process is root it runs as the postgres system user (else nobody), as the
// PostgreSQL server does, since PgBouncer refuses root too. It returns ErrNoPgBouncer when the program is not
// installed. Client startup parameters are PgBouncer's defaults: one it does not know (such as a custom
// setting) makes it refuse the connection, as it would in production.
func StartPgBouncer(ctx context.Context, opts PgBouncerOptions) (_ *PgBouncer, err error) {
	logger := orDiscard(opts.Logger)
	program, err := pgbouncerProgram()
	if err != nil {
		return nil, err
	}
	if len(opts.Users) == 0 {
		return nil, errors.New("pgcluster: StartPgBouncer: no user")
	}
	upstream, err := pgconn.ParseConfig(opts.Upstream)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: StartPgBouncer: upstream: %w", err)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}

	dir, err := os.MkdirTemp("", pgbouncerDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create pgbouncer directory: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	var users strings.Builder
	for _, u := range opts.Users {
		fmt.Fprintf(&users, "%q \"\"\n", u)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(users.String()), 0o644); err != nil {
		return nil, fmt.Errorf("write pgbouncer auth file: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "pgbouncer.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create pgbouncer log: %w", err)
	}
	defer func() {
		if err != nil {
			_ = logf.Close()
		}
	}()
	for _, path := range []string{dir, filepath.Join(dir, "users.txt"), logf.Name()} {
		if err := chownTo(path, cred); err != nil {
			return nil, err
		}
	}

	// The free port is found by binding and releasing it, so another process may take it first: try again.
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		ini := pgbouncerConfig(dir, port, upstream.Host, upstream.Port, opts)
		if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
			return nil, fmt.Errorf("write pgbouncer configuration: %w", err)
		}
		b := &PgBouncer{Port: port, Dir: dir, logf: logf}
		if lastErr = b.start(ctx, program, cred); lastErr == nil {
			logger.Debug("pgcluster: pgbouncer running", slog.Int("port", port), slog.String("dir", dir))
			return b, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%w\npgbouncer log:\n%s", lastErr, tail([]byte(readLog(logf.Name())), 4000))
}

// pgbouncerProgram finds the pgbouncer program: in PATH, else where Debian installs it (/usr/sbin, which a
// user's PATH may lack).
func pgbouncerProgram() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if isExecutable("/usr/sbin/pgbouncer") {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNoPgBouncer
}

// pgbouncerConfig is the pgbouncer.ini of a PgBouncer in dir on port, forwarding every database to host:port.
func pgbouncerConfig(dir string, port int, host string, upstreamPort uint16, opts PgBouncerOptions) string {
	mode := opts.PoolMode
	if mode == "" {
		mode = "transaction"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[databases]\n* = host=%s port=%d\n\n[pgbouncer]\n", host, upstreamPort)
	for _, s := range []string{
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(dir, "users.txt"),
		"pool_mode = " + mode,
		"max_client_conn = 1000",
		// Log to stderr (the log file of this package): no syslog, no pid file.
		"logfile =",
		"pidfile =",
	} {
		b.WriteString(s + "\n")
	}
	for _, s := range opts.Settings {
		name, value, _ := strings.Cut(s, "=")
		fmt.Fprintf(&b, "%s = %s\n", strings.TrimSpace(name), strings.TrimSpace(value))
	}
	return b.String()
}

// start runs PgBouncer and waits until its port accepts connections.
func (b *PgBouncer) start(ctx context.Context, program string, cred *syscall.Credential) error {
	cmd := exec.Command(program, filepath.Join(b.Dir, "pgbouncer.ini"))
	cmd.Dir = b.Dir
	cmd.Stdout, cmd.Stderr = b.logf, b.logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: cred,
		// If this process dies without stopping PgBouncer, PgBouncer shuts down at once (SIGTERM) rather than
		// outliving it.
		Pdeathsig: syscall.SIGTERM,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	b.cmd, b.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(b.exited)
	}()

	readyCtx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port))
	for {
		conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(readyCtx, "tcp", addr)
		if err == nil {
			return conn.Close()
		}
		select {
		case <-readyCtx.Done():
			b.shutdown()
			return fmt.Errorf("pgbouncer on port %d not ready: %w", b.Port, readyCtx.Err())
		case <-b.exited:
			return fmt.Errorf("pgbouncer on port %d exited while starting", b.Port)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// URL returns u (a postgres:// URL of a database on the upstream server) with PgBouncer's address instead of
// the server's: the same user, database and parameters, through PgBouncer.
func (b *PgBouncer) URL(u string) (string, error) {
	parsed, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("pgcluster: pgbouncer URL: %w", err)
	}
	parsed.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port))
	return parsed.String(), nil
}

// Log returns what PgBouncer has logged so far.
func (b *PgBouncer) Log() string { return readLog(b.logf.Name()) }

// Stop ends PgBouncer (immediate shutdown: every client connection is dropped) and removes its directory; it is
// idempotent.
func (b *PgBouncer) Stop() error {
	b.stopOnce.Do(func() {
		b.shutdown()
		errs := []error{b.logf.Close()}
		if err := os.RemoveAll(b.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove pgbouncer directory: %w", err))
		}
		b.stopErr = errors.Join(errs...)
	})
	return b.stopErr
}

// shutdown sends SIGTERM (PgBouncer's immediate shutdown), then SIGKILL if it is still running 10 s later, and
// waits until it has exited.
func (b *PgBouncer) shutdown() {
	for _, step := range []struct {
		signal syscall.Signal
		wait   time.Duration
	}{{syscall.SIGTERM, 10 * time.Second}, {syscall.SIGKILL, time.Minute}} {
		_ = b.cmd.Process.Signal(step.signal)
		select {
		case <-b.exited:
			return
		case <-time.After(step.wait):
		}
	}
}

// readLog returns the contents of the log file at path ("" when it cannot be read).
func readLog(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}
