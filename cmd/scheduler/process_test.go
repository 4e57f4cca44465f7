package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// schedulerMainEnv makes the test binary run the scheduler's main with its own arguments (see TestMain): tests
// start real `scheduler` processes with startScheduler, to signal or kill them.
const schedulerMainEnv = "STEPREADY_TEST_SCHEDULER_MAIN"

// schedulerProcess is a `scheduler` process started by a test.
type schedulerProcess struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{} // closed once the process has been waited for
	err    error         // Wait's error, once exited is closed
}

// startScheduler starts `scheduler ARGS…` as a process of its own, with the machine's environment minus any
// stepready or database setting, plus env. It is killed when the test ends if it still runs; its stderr (the
// logs) is printed when the test failed.
func startScheduler(t *testing.T, env []string, args ...string) *schedulerProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STEPREADY_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, schedulerMainEnv+"=1"), env...)
	p := &schedulerProcess{cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("scheduler %s (pid %d) stderr:\n%s", strings.Join(args, " "), cmd.Process.Pid, p.stderr.String())
		}
	})
	return p
}

// signal sends sig to the process.
func (p *schedulerProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// wait waits until the process exits, at most timeout, and returns its exit status.
func (p *schedulerProcess) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("scheduler did not exit within %s; stderr:\n%s", timeout, p.stderr.String())
		return -1
	}
}

// waitFor polls cond every 20 ms until it holds, failing the test with what after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		<-time.After(20 * time.Millisecond)
	}
}

// stepOfTask reads the state and attempts of a one-step task's step.
func stepOfTask(t *testing.T, pool *pgxpool.Pool, taskID int64) (state string, attempts int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT state, attempts FROM stepready.steps WHERE task_id = $1`, taskID).Scan(&state, &attempts))
	return state, attempts
}
