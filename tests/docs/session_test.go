package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A page's commands run in one bash process, fed one block at a time, so that what a block sets (TASK=…, a
// file, cd) holds for the blocks after it, as in the reader's terminal.

const (
	// blockTimeout bounds one block's run.
	blockTimeout = 2 * time.Minute
	// pollFor bounds how long a `test poll` block's last command is run again until its output matches: the
	// daemon of a page works at its own pace, on a machine that may be busy.
	pollFor = 90 * time.Second
	// pollEvery is the pause between two runs of a polled command.
	pollEvery = 200 * time.Millisecond
	// backgroundStartFor bounds how long a background command may take to print what the page waits for.
	backgroundStartFor = 3 * time.Minute
	// doneMarker ends the output of a block; errorMarker reports a command that failed.
	doneMarker  = "@@docs-test-done@@"
	errorMarker = "@@docs-test-error"
)

// session is the bash process a page runs in.
type session struct {
	t       *testing.T
	dir     string // the page's working directory
	scratch string // where block scripts are written
	env     []string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string
	stderr  *syncBuffer
	n       int
	bgs     []*background
}

// newSession starts bash in dir with env; it ends (with its background commands) when t ends.
func newSession(t *testing.T, dir string, env []string) *session {
	t.Helper()
	s := &session{t: t, dir: dir, scratch: t.TempDir(), env: env, lines: make(chan string, 1024), stderr: &syncBuffer{}}
	s.cmd = exec.Command("bash", "--noprofile", "--norc")
	s.cmd.Dir, s.cmd.Env = dir, env
	s.cmd.Stderr = s.stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var err error
	s.stdin, err = s.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := s.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, s.cmd.Start())
	go func() {
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				s.lines <- strings.TrimSuffix(line, "\n")
			}
			if err != nil {
				close(s.lines)
				return
			}
		}
	}()
	t.Cleanup(s.close)
	// pipefail and an ERR trap instead of set -e: a failing command is reported (with its line) and the
	// session survives to say so.
	_, err = fmt.Fprintf(s.stdin, "set -o pipefail -E\ntrap 'printf \"\\n%s status=%%s line=%%s@@\\n\" \"$?\" \"$LINENO\"' ERR\n",
		errorMarker)
	require.NoError(t, err)
	return s
}

// run runs script in the session and returns what it printed on standard output. A command that fails, or a
// script that does not end within blockTimeout, fails the test naming where.
func (s *session) run(where, script string) string {
	s.t.Helper()
	s.n++
	path := filepath.Join(s.scratch, fmt.Sprintf("block-%d.sh", s.n))
	require.NoError(s.t, os.WriteFile(path, []byte(script+"\n"), 0o600))
	errFrom := s.stderr.Len()
	_, err := fmt.Fprintf(s.stdin, "source %q </dev/null\nprintf '\\n%s\\n'\n", path, doneMarker)
	require.NoError(s.t, err, "%s: write to bash", where)
	var out []string
	failed := ""
	deadline := time.After(blockTimeout)
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				s.t.Fatalf("%s: bash exited while running:\n%s\nstdout:\n%s\nstderr:\n%s", where, script,
					strings.Join(out, "\n"), s.stderr.From(errFrom))
			}
			if line == doneMarker {
				// The marker's printf starts with a newline of its own.
				if n := len(out); n > 0 && out[n-1] == "" {
					out = out[:n-1]
				}
				if failed != "" {
					s.t.Fatalf("%s: a command failed (%s):\n%s\nstdout:\n%s\nstderr:\n%s", where, failed, script,
						strings.Join(out, "\n"), s.stderr.From(errFrom))
				}
				return strings.Join(out, "\n")
			}
			if rest, ok := strings.CutPrefix(line, errorMarker); ok {
				if failed == "" {
					failed = strings.TrimSuffix(strings.TrimSpace(rest), "@@")
				}
				if n := len(out); n > 0 && out[n-1] == "" {
					out = out[:n-1]
				}
				continue
			}
			out = append(out, line)
		case <-deadline:
			s.t.Fatalf("%s: still running after %s:\n%s\nstdout so far:\n%s\nstderr:\n%s", where, blockTimeout, script,
				strings.Join(out, "\n"), s.stderr.From(errFrom))
		}
	}
}

// close ends bash and the page's background commands.
func (s *session) close() {
	_ = s.stdin.Close()
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	for _, bg := range s.bgs {
		bg.stop(s.t)
	}
}

// background is a command a page leaves running (a daemon).
type background struct {
	command string
	cmd     *exec.Cmd
	out     *syncBuffer
	exited  chan struct{}
}

// startBackground runs command with bash in the session's directory and environment, in a process group of its
// own, and waits until its output holds until.
func (s *session) startBackground(where, command, until string) {
	s.t.Helper()
	bg := &background{command: command, out: &syncBuffer{}, exited: make(chan struct{})}
	bg.cmd = exec.Command("bash", "--noprofile", "--norc", "-c", command)
	bg.cmd.Dir, bg.cmd.Env = s.dir, s.env
	bg.cmd.Stdout, bg.cmd.Stderr = bg.out, bg.out
	bg.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(s.t, bg.cmd.Start(), "%s: start %s", where, command)
	go func() { _ = bg.cmd.Wait(); close(bg.exited) }()
	s.bgs = append(s.bgs, bg)
	deadline := time.Now().Add(backgroundStartFor)
	for !strings.Contains(bg.out.String(), until) {
		select {
		case <-bg.exited:
			s.t.Fatalf("%s: %s exited before printing %q:\n%s", where, command, until, bg.out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: %s has not printed %q after %s:\n%s", where, command, until, backgroundStartFor,
				bg.out.String())
		}
	}
}

// stop interrupts the command (SIGINT: a daemon stops gracefully), then kills what is left of its group.
func (bg *background) stop(t *testing.T) {
	select {
	case <-bg.exited:
	default:
		_ = syscall.Kill(-bg.cmd.Process.Pid, syscall.SIGINT)
		select {
		case <-bg.exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-bg.cmd.Process.Pid, syscall.SIGKILL)
			<-bg.exited
		}
	}
	if t.Failed() {
		t.Logf("background %s printed:\n%s", bg.command, bg.out.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a process's writes and the test's reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

// From returns what was written from offset n on.
func (b *syncBuffer) From(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()[n:]
}
