package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// serverCredential returns the credential to run initdb, pg_ctl and postgres with: nil (the current user)
// unless this process runs as root, which PostgreSQL refuses; then the postgres system user, else nobody.
func serverCredential() (*syscall.Credential, error) {
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

// chownTo hands path to the server user (nothing to do without a credential).
func chownTo(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
		return fmt.Errorf("hand %s to uid %d: %w", path, cred.Uid, err)
	}
	return nil
}

// canEnter reports whether the server user may enter dir (every parent must be searchable by it: a clone under
// /root, mode 0700, is not). It runs `postgres --version` as that user with dir as working directory.
func canEnter(postgres, dir string, cred *syscall.Credential) bool {
	if cred == nil {
		return true
	}
	cmd := exec.Command(postgres, "--version")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	return cmd.Run() == nil
}

// runAs runs a PostgreSQL program as the server user in dir and returns its combined output in the error. When
// ctx ends the program gets SIGTERM, which initdb answers by removing what it made, so that an interrupted
// first run leaves no half-made data directory behind.
func runAs(ctx context.Context, cred *syscall.Credential, dir, program string, args ...string) error {
	cmd := exec.CommandContext(ctx, program, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", cmd, err, bytes.TrimSpace(out))
	}
	return nil
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

// portFree reports whether port can be bound on 127.0.0.1 now.
func portFree(port int) bool {
	if port <= 0 || port > 65535 {
		return false
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// serverURL is the URL of database on the local server at port, as the superuser postgres (trust
// authentication, TCP on 127.0.0.1).
func serverURL(port int, database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", port, database)
}

// waitReady polls the server at url until it accepts a connection, ctx ends, or exited is closed (the server
// process died; nil when the server is not a child of this process).
func waitReady(ctx context.Context, url string, exited <-chan struct{}) error {
	var lastErr error
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(attemptCtx, url)
		cancel()
		if err == nil {
			return conn.Close(ctx)
		}
		lastErr = err

		select {
		case <-ctx.Done():
			return fmt.Errorf("server not ready: %w (last error: %w)", ctx.Err(), lastErr)
		case <-exited:
			return fmt.Errorf("server exited while starting (last error: %w)", lastErr)
		case <-time.After(50 * time.Millisecond):
		}
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

// tail returns at most the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
