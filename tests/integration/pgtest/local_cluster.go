package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// localCluster is a throwaway PostgreSQL cluster: a data directory made by initdb in a temporary directory and
// a postgres process serving it on 127.0.0.1, both removed by stop.
type localCluster struct {
	// url is the URL of the maintenance database, as the superuser postgres (trust authentication).
	url string

	// dir is the temporary directory holding the data directory (data/) and the server log (postgres.log).
	dir string

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
	logf   *os.File
}

const (
	// clusterDirPrefix starts the name of every cluster directory in the temporary directory.
	clusterDirPrefix = "stepready-pgtest-"

	// ownerFile, in a cluster directory, holds the process id of the test process that made it.
	ownerFile = "owner.pid"
)

// clusterSettings make the throwaway cluster fast at the expense of crash safety, which a test database does
// not need, and let many parallel tests connect.
var clusterSettings = []string{
	"fsync=off",
	"synchronous_commit=off",
	"full_page_writes=off",
	"max_connections=300",
	"checkpoint_timeout=1h",
	"max_wal_size=4GB",
}

// startLocalCluster initialises and starts a cluster with the newest local PostgreSQL binaries.
func startLocalCluster(ctx context.Context) (_ *localCluster, err error) {
	binDir, err := findPostgresBinDir()
	if err != nil {
		return nil, err
	}

	cred, err := clusterCredential()
	if err != nil {
		return nil, err
	}

	removeAbandonedClusters()
	dir, err := os.MkdirTemp("", clusterDirPrefix)
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
	if cred != nil {
		// The unprivileged server user must own the tree; the parent (the temporary directory) lets it in.
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("hand cluster directory to uid %d: %w", cred.Uid, err)
		}
	}
	dataDir := filepath.Join(dir, "data")

	initdb := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"),
		"--pgdata", dataDir, "--username", "postgres", "--auth", "trust",
		"--encoding", "UTF8", "--locale", "C", "--no-sync", "--no-instructions")
	initdb.Dir = dir // the server user may not be allowed into the test's working directory
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", initdb, err, out)
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
		cluster, err := startPostgres(ctx, binDir, dir, dataDir, cred, logf)
		if err == nil {
			return cluster, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	logTail, _ := os.ReadFile(logf.Name())
	return nil, fmt.Errorf("%w\nserver log:\n%s", lastErr, tail(logTail, 4000))
}

// startPostgres starts the server of an initialised cluster on a free port and waits until it accepts
// connections.
func startPostgres(ctx context.Context, binDir, dir, dataDir string, cred *syscall.Credential, logf *os.File) (*localCluster, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}

	args := []string{"-D", dataDir, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + dataDir}
	for _, setting := range clusterSettings {
		args = append(args, "-c", setting)
	}
	cmd := exec.Command(filepath.Join(binDir, "postgres"), args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: cred,
		// If the test process dies without stopping the server, the server shuts down immediately (SIGQUIT) rather
		// than outliving it.
		Pdeathsig: syscall.SIGQUIT,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}

	c := &localCluster{
		url:    fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		dir:    dir,
		cmd:    cmd,
		exited: make(chan struct{}),
		logf:   logf,
	}
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()

	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := waitReady(readyCtx, c.url, c.exited); err != nil {
		c.shutdown()
		return nil, fmt.Errorf("start postgres on port %d: %w", port, err)
	}
	return c, nil
}

// stop shuts the server down and removes the cluster's directory.
func (c *localCluster) stop() error {
	c.shutdown()
	errs := []error{c.logf.Close()}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove cluster directory: %w", err))
	}
	return errors.Join(errs...)
}

// shutdown asks the server for a fast shutdown (SIGINT: disconnect everyone, no waiting), escalating to an
// immediate shutdown (SIGQUIT) and then SIGKILL if it takes too long, and waits until it has exited.
func (c *localCluster) shutdown() {
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

// findPostgresBinDir returns the directory holding initdb and postgres of the newest PostgreSQL major version
// among PATH and /usr/lib/postgresql/*/bin; on a tie, the one in PATH.
func findPostgresBinDir() (string, error) {
	var candidates []string
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if resolved, err := filepath.EvalSymlinks(initdb); err == nil {
			initdb = resolved
		}
		candidates = append(candidates, filepath.Dir(initdb))
	}
	installed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	candidates = append(candidates, installed...)

	type found struct {
		dir   string
		major int
	}
	var dirs []found
	for _, dir := range candidates {
		if slices.ContainsFunc(dirs, func(f found) bool { return f.dir == dir }) {
			continue
		}
		if !isExecutable(filepath.Join(dir, "initdb")) || !isExecutable(filepath.Join(dir, "postgres")) {
			continue
		}
		major, err := postgresMajorVersion(filepath.Join(dir, "postgres"))
		if err != nil {
			continue
		}
		dirs = append(dirs, found{dir: dir, major: major})
	}
	if len(dirs) == 0 {
		return "", errors.New("no initdb and postgres in PATH or /usr/lib/postgresql/*/bin " +
			"(install PostgreSQL 15 or newer, e.g. apt-get install postgresql)")
	}

	slices.SortStableFunc(dirs, func(a, b found) int { return b.major - a.major })
	if dirs[0].major < 15 {
		return "", fmt.Errorf("the newest local PostgreSQL is %d (in %s); stepready needs 15 or newer", dirs[0].major, dirs[0].dir)
	}
	return dirs[0].dir, nil
}

// versionPattern finds the major version in "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)".
var versionPattern = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// postgresMajorVersion runs `postgres --version` and returns the major version.
func postgresMajorVersion(postgres string) (int, error) {
	out, err := exec.Command(postgres, "--version").Output()
	if err != nil {
		return 0, err
	}
	match := versionPattern.FindSubmatch(out)
	if match == nil {
		return 0, fmt.Errorf("unrecognised version %q", bytes.TrimSpace(out))
	}
	return strconv.Atoi(string(match[1]))
}

// isExecutable reports whether path is a regular file with an execute bit.
func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0
}

// clusterCredential returns the credential to run initdb and postgres with: nil (the current user) unless the
// tests run as root, which PostgreSQL refuses; then the postgres system user, else nobody.
func clusterCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, uidErr := strconv.ParseUint(u.Uid, 10, 32)
		gid, gidErr := strconv.ParseUint(u.Gid, 10, 32)
		if uidErr != nil || gidErr != nil || uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root and neither a postgres nor a nobody user exists to run the server as")
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

// tail returns at most the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// removeAbandonedClusters deletes the cluster directories of test processes that died without cleaning up (a
// test binary killed by -timeout, say): their owner process is gone and so is the server (its postmaster.pid
// names no live process). Anything that cannot be read is left alone.
func removeAbandonedClusters() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), clusterDirPrefix+"*"))
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

// readPid reads the process id on the first line of file.
func readPid(file string) (int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	first, _, _ := bytes.Cut(b, []byte("\n"))
	return strconv.Atoi(string(bytes.TrimSpace(first)))
}

// processAlive reports whether a process with id pid exists (EPERM: it exists but belongs to another user).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
