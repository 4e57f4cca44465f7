//go:build linux

package builtin

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The watchdog kills the process group it was told about once its input ends (the daemon's end of the pipe
// closed), and nothing when the input ends before a group was named.
func TestExecWatchdogKillsTheGroupAtEndOfInput(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("/bin/sh", "-c", "sleep 600 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })

	r, w := io.Pipe()
	done := make(chan int, 1)
	go func() { done <- runWatchdog(r) }()
	_, err := fmt.Fprintf(w, "%d\n", cmd.Process.Pid)
	require.NoError(t, err)
	select {
	case <-done:
		t.Fatal("the watchdog returned before the end of its input")
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, w.Close())
	require.Equal(t, 0, <-done)
	err = cmd.Wait()
	require.ErrorContains(t, err, "signal: killed", "the group was killed")

	require.Equal(t, 0, runWatchdog(strings.NewReader("")), "nothing named: nothing to do")
	require.Equal(t, 2, runWatchdog(strings.NewReader("1\n")), "never the init process's group")
}

// A command run to its end leaves no watchdog behind, and its background processes that outlive it are left
// alone (only a daemon's death kills them). Not parallel: the exec tests running in parallel have watchdogs of
// their own.
func TestExecDismissesItsWatchdog(t *testing.T) {
	h := &execHandler{}
	pidFile := filepath.Join(t.TempDir(), "pid")
	_, err := run(context.Background(), h, execInputJSON(t, `sleep 600 >/dev/null 2>&1 & echo $! > "$PID_FILE"`,
		map[string]any{"env": map[string]string{"PID_FILE": pidFile}}), 1)
	require.NoError(t, err)
	b, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	require.True(t, alive(pid), "the background process runs on")

	// No process of this test binary is a watchdog any more.
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if len(fields) > 1 && fields[1] == strconv.Itoa(self) && strings.HasPrefix(string(cmdline), watchdogName) {
			t.Errorf("watchdog %d still runs", child)
		}
	}
}
