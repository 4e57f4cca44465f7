package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
)

// schedulerPackage is built into the daemon whose memory scenario 6 measures.
const schedulerPackage = "github.com/stepready/stepready/cmd/scheduler"

// memoryProbe is the task that tells the harness the daemon is up and has run one step.
var memoryProbe = json.RawMessage(`{"name": "probe", "steps": [{"name": "s", "handler": "noop"}]}`)

// memory is scenario 6: the peak resident set of the real daemon (`scheduler run`, a child process) while it
// works the workload of scenario 2a, read from the kernel's VmHWM of that process alone.
func memory(ctx context.Context, env *Env, size Size) ([]Row, error) {
	bin, _, remove, err := buildScheduler(ctx)
	if err != nil {
		return nil, err
	}
	defer remove()
	m, err := measureDaemon(ctx, env, bin, size.MemorySteps, nil)
	if err != nil {
		return nil, err
	}
	const limit = 100_000_000 // bytes: the target of 100 MB
	return []Row{{Scenario: "6 memory",
		Figure: fmt.Sprintf("peak RSS (VmHWM) of `scheduler run --dispatch direct --concurrency %d`, %d no-op steps at %.0f steps/s",
			benchConcurrency, size.MemorySteps, m.stepsPerSecond),
		Value: megabytes(m.peak), Unit: "MB", Baseline: "RSS after its first step", BaseVal: megabytes(m.idle),
		Ratio: float64(m.peak) / float64(m.idle), Target: "<= 100 MB", Met: boolp(m.peak <= limit)}}, nil
}

func megabytes(b int64) float64 { return float64(b) / 1e6 }

// buildScheduler compiles the scheduler command into a new temporary directory and returns the binary's path and
// that directory (for the scenario's other files); remove deletes the directory. On error nothing is left behind.
func buildScheduler(ctx context.Context) (bin, dir string, remove func(), err error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", "", nil, fmt.Errorf("build %s: the go command is not in PATH: %w", schedulerPackage, err)
	}
	if dir, err = os.MkdirTemp("", "stepready-bench-"); err != nil {
		return "", "", nil, err
	}
	remove = func() { _ = os.RemoveAll(dir) }
	bin = filepath.Join(dir, "scheduler")
	if out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, schedulerPackage).CombinedOutput(); err != nil {
		remove()
		return "", "", nil, fmt.Errorf("build %s: %w\n%s", schedulerPackage, err, out)
	}
	return bin, dir, remove, nil
}

// daemonMemory is what measureDaemon saw, in bytes.
type daemonMemory struct {
	idle, peak     int64
	stepsPerSecond float64
}

// measureDaemon runs bin as `scheduler run` on a fresh database (first loaded by preload unless nil), waits until
// it has completed a probe task, reads its resident set (the baseline), then loads n independent no-op steps in
// one transaction and reads its peak resident set once they are all complete. The daemon uses its built-in noop
// handler.
func measureDaemon(ctx context.Context, env *Env, bin string, n int, preload func(*pgxpool.Pool) error) (
	daemonMemory, error) {
	pool, url, err := env.NewDB(ctx, 4)
	if err != nil {
		return daemonMemory{}, err
	}
	defer pool.Close()
	if preload != nil {
		if err := preload(pool); err != nil {
			return daemonMemory{}, fmt.Errorf("preload: %w", err)
		}
	}
	args := []string{"run", "--database-url", url, "--dispatch", stepready.DispatchDirect,
		"--concurrency", strconv.Itoa(benchConcurrency), "--poll-interval", "1s", "--log-level", "warn"}
	if env.Options.PollOnly {
		args = append(args, "--poll-only")
	}
	d, err := startDaemon(ctx, bin, args...)
	if err != nil {
		return daemonMemory{}, err
	}
	defer d.kill()

	if _, err := stepready.CreateTask(ctx, pool, memoryProbe); err != nil {
		return daemonMemory{}, err
	}
	if err := d.waitComplete(ctx, pool, 1, time.Minute); err != nil {
		return daemonMemory{}, fmt.Errorf("probe task: %w", err)
	}
	var m daemonMemory
	if m.idle, err = d.status("VmRSS"); err != nil {
		return daemonMemory{}, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return daemonMemory{}, err
	}
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 'memory' FROM generate_series(1, %d)`, n),
		`INSERT INTO stepready.steps (task_id, name, handler) SELECT id, 's', 'noop' FROM stepready.tasks WHERE name = 'memory'`,
	} {
		if _, err := tx.Exec(ctx, s); err != nil {
			_ = tx.Rollback(ctx)
			return daemonMemory{}, fmt.Errorf("load: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return daemonMemory{}, err
	}
	begin := time.Now()
	if _, err := pool.Exec(ctx, `ANALYZE stepready.steps, stepready.tasks`); err != nil {
		return daemonMemory{}, err
	}
	if err := d.waitComplete(ctx, pool, n+1, 10*time.Minute); err != nil {
		return daemonMemory{}, err
	}
	m.stepsPerSecond = stepsPerSecond(n, time.Since(begin))
	if m.peak, err = d.status("VmHWM"); err != nil {
		return daemonMemory{}, err
	}
	return m, d.stop(30 * time.Second)
}

// daemon is a scheduler child process.
type daemon struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has exited; err is then set
	err    error
	stderr *tailBuffer
}

// startDaemon starts bin with args and an environment without STEPREADY_* and DATABASE_URL variables, so that
// only the arguments configure it.
func startDaemon(ctx context.Context, bin string, args ...string) (*daemon, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STEPREADY_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	d := &daemon{cmd: cmd, exited: make(chan struct{}), stderr: &tailBuffer{max: 8 << 10}}
	cmd.Stdout, cmd.Stderr = d.stderr, d.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		d.err = cmd.Wait()
		close(d.exited)
	}()
	return d, nil
}

// status reads one kB field of the daemon's /proc/<pid>/status and returns it in bytes.
func (d *daemon) status(field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("daemon memory: %w", err)
	}
	kb, err := statusKB(b, field)
	if err != nil {
		return 0, fmt.Errorf("daemon memory: /proc/%d/status: %w", d.cmd.Process.Pid, err)
	}
	return kb * 1024, nil
}

// waitComplete waits with waitTasks until want tasks are complete, failing early if the daemon exits.
func (d *daemon) waitComplete(ctx context.Context, pool *pgxpool.Pool, want int, limit time.Duration) error {
	err := waitTasks(ctx, pool, want, limit, d.exited)
	switch {
	case errors.Is(err, errExited):
		return fmt.Errorf("the daemon exited (%v) before its work was done; its output:\n%s", d.err, d.stderr)
	case err != nil:
		return fmt.Errorf("%w; the daemon's output:\n%s", err, d.stderr)
	}
	return nil
}

// stop sends SIGTERM and waits for a graceful exit with status 0.
func (d *daemon) stop(grace time.Duration) error {
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop the daemon: %w", err)
	}
	select {
	case <-d.exited:
	case <-time.After(grace):
		d.kill()
		return fmt.Errorf("the daemon did not stop within %s of SIGTERM; its output:\n%s", grace, d.stderr)
	}
	if d.err != nil {
		return fmt.Errorf("the daemon exited with %w; its output:\n%s", d.err, d.stderr)
	}
	return nil
}

// kill ends the daemon at once unless it has exited, and waits for it.
func (d *daemon) kill() {
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Kill()
	<-d.exited
}

// statusKB returns the value of field (VmRSS, VmHWM, …) in a /proc/<pid>/status document, in kB.
func statusKB(status []byte, field string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		parts := strings.Fields(value)
		if len(parts) != 2 || parts[1] != "kB" {
			return 0, fmt.Errorf("field %s: want \"<number> kB\", got %q", field, strings.TrimSpace(value))
		}
		kb, err := strconv.ParseInt(parts[0], 10, 64)
		if err != nil || kb < 0 {
			return 0, fmt.Errorf("field %s: %q is not a size in kB", field, parts[0])
		}
		return kb, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no field %s", field)
}

// tailBuffer keeps the last max bytes written to it; it is safe for concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

// Write implements io.Writer.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

// String returns what the buffer holds.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
