package conformance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/python"
)

// workerSpec is a worker implementation under test: a command line and what it declares.
type workerSpec struct {
	// name names the subtests.
	name string
	// argv is the command, run directly (no shell), with the suite's environment added to this process's own.
	argv []string
	// rules: the worker evaluates outcome rules (SPEC §8), as the Go daemon does.
	rules bool
}

// Environment of the suite (README.md).
const (
	// envWorkerCmd is the command line of the worker to test, split on white space.
	envWorkerCmd = "WORKER_CMD"
	// envWorkerRules, set to 1 or true, declares that the worker evaluates outcome rules.
	envWorkerRules = "WORKER_RULES"
	// envWorkerName names the worker in the subtests (default "worker").
	envWorkerName = "WORKER_NAME"
)

// workersUnderTest returns the worker of WORKER_CMD when it is set; else the reference workers of this
// repository: `scheduler run` in both dispatch modes (built here) and the Python worker.
func workersUnderTest(t *testing.T) []workerSpec {
	t.Helper()
	if cmd := strings.TrimSpace(os.Getenv(envWorkerCmd)); cmd != "" {
		rules := strings.ToLower(strings.TrimSpace(os.Getenv(envWorkerRules)))
		name := strings.TrimSpace(os.Getenv(envWorkerName))
		if name == "" {
			name = "worker"
		}
		return []workerSpec{{name: name, argv: strings.Fields(cmd), rules: rules == "1" || rules == "true"}}
	}
	root := repoRoot(t)
	scheduler := buildScheduler(t, root)
	py, err := python.Find("psycopg")
	require.NoError(t, err, "the Python worker's conformance needs an interpreter that imports psycopg")
	return []workerSpec{
		{name: "go-river", argv: []string{scheduler, "run", "--dispatch", "river"}, rules: true},
		{name: "go-direct", argv: []string{scheduler, "run", "--dispatch", "direct"}, rules: true},
		{name: "python", argv: []string{py, "-m", "stepready_worker", "--builtins"}},
	}
}

// repoRoot is the module's root directory (two levels up from this package).
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// buildScheduler builds cmd/scheduler once per test process, into a directory removed when the process ends.
func buildScheduler(t *testing.T, root string) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "stepready-conformance-")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		// go in PATH, else where the project's machines install it (the Makefile adds it to PATH the same way).
		goTool := "go"
		if _, err := exec.LookPath(goTool); err != nil {
			goTool = "/usr/local/go/bin/go"
		}
		buildPath = filepath.Join(dir, "scheduler")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool, "build", "-o", buildPath, "./cmd/scheduler")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/scheduler: %w\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return buildPath
}

// buildDir holds the scheduler binary built for the suite; TestMain removes it.
var buildDir string

// workerProcess is one running worker.
type workerProcess struct {
	cmd    *exec.Cmd
	logs   *syncBuffer
	exited chan struct{}
}

// startWorker starts spec's command with this process's environment (minus STEPREADY_* and DATABASE_URL) plus
// env, in a process group of its own. It is killed when the test ends if it still runs; its output is logged
// when the test failed.
func startWorker(t *testing.T, spec workerSpec, env map[string]string) *workerProcess {
	t.Helper()
	cmd := exec.Command(spec.argv[0], spec.argv[1:]...)
	cmd.Dir = repoRoot(t)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STEPREADY_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if spec.name == "python" && os.Getenv(envWorkerCmd) == "" {
		cmd.Env = append(cmd.Env, "PYTHONPATH="+filepath.Join(repoRoot(t), "workers", "python"),
			"PYTHONDONTWRITEBYTECODE=1")
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &workerProcess{cmd: cmd, logs: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start(), "start %v", spec.argv)
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT) // in case a case left it stopped
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
		}
		if t.Failed() {
			t.Logf("worker %s (pid %d) output:\n%s", strings.Join(spec.argv, " "), cmd.Process.Pid, p.logs.String())
		}
	})
	return p
}

// signal sends sig to the worker process.
func (p *workerProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// waitExit waits for the worker to exit, at most timeout, and returns its exit status.
func (p *workerProcess) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("worker did not exit within %s", timeout)
		return -1
	}
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the test's reads.
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
