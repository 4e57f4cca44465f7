package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/steps/builtin"
)

// execKillScript is an `exec` step's command: its first run starts a child (a background sleep), writes the
// shell's and the child's pids to $D/pids and waits; a later run writes to $D/overlap every pid of the first
// run that is still alive (not a zombie), then succeeds.
const execKillScript = `
if [ -e "$D/first" ]; then
	for p in $(cat "$D/pids"); do
		if [ -r "/proc/$p/stat" ] && [ "$(cut -d' ' -f3 "/proc/$p/stat")" != Z ]; then echo "$p" >> "$D/overlap"; fi
	done
	exit 0
fi
: > "$D/first"
sleep 600 &
echo "$$ $!" > "$D/pids.tmp" && mv "$D/pids.tmp" "$D/pids"
wait
`

// A daemon process killed with SIGKILL while an `exec` step runs takes the command and the command's children
// with it (within moments, not at the end of the command), so the daemon that reaps and retries the step never
// runs it while the first copy still runs. Both dispatch modes. The command has a process group of its own, so
// before the parent-death signal and the watchdog (steps/builtin/exec_linux.go) both the shell and its sleep ran
// on after the kill, and the retry overlapped them.
func TestExecCommandsDieWithTheirDaemon(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			dir := t.TempDir()
			input, err := json.Marshal(map[string]any{"command": []string{"/bin/sh", "-c", execKillScript},
				"env": map[string]string{"D": dir}})
			require.NoError(t, err)
			id := b.createTask(t, `{"name": "exec-kill", "steps": [{"name": "s", "handler": "exec", "input": `+
				string(input)+`, "retry": {"max_attempts": 3, "backoff": "fixed", "base_delay_ms": 0}}]}`)

			child := startChild(t, b, mode)
			var pids []int
			deadline := time.Now().Add(30 * time.Second)
			for pids == nil {
				if data, err := os.ReadFile(filepath.Join(dir, "pids")); err == nil {
					for _, f := range strings.Fields(string(data)) {
						pid, err := strconv.Atoi(f)
						require.NoError(t, err)
						pids = append(pids, pid)
					}
				}
				require.True(t, time.Now().Before(deadline), "the command never wrote its pids")
				<-time.After(10 * time.Millisecond)
			}
			require.Len(t, pids, 2)
			t.Cleanup(func() { // whatever the outcome, leave nothing running
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			for _, pid := range pids {
				require.True(t, processAlive(pid), "pid %d runs", pid)
			}

			require.NoError(t, child.Process.Kill())
			_ = child.Wait()
			// The surviving daemon, which reaps the step once its lease (2 s) has expired and runs it again.
			b.reg = steps.NewRegistry()
			require.NoError(t, builtin.Register(b.reg, builtin.Options{AllowExec: true}))
			b.start(t, stepready.Config{Dispatch: mode, Lease: 2 * time.Second, ReapInterval: time.Second,
				PollInterval: 200 * time.Millisecond})

			deadline = time.Now().Add(5 * time.Second)
			for _, pid := range pids {
				for processAlive(pid) {
					require.True(t, time.Now().Before(deadline), "pid %d (of %v) outlived its daemon by 5 s", pid, pids)
					<-time.After(10 * time.Millisecond)
				}
			}
			b.waitTask(t, id, 30*time.Second, "complete")
			overlap, err := os.ReadFile(filepath.Join(dir, "overlap"))
			if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the retry ran while the first run's processes %q were alive (%v)", overlap, err)
			}
			var attempts int
			var class string
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT s.attempts, e.details ->> 'class'
				FROM stepready.steps s JOIN stepready.step_events e ON e.step_id = s.id AND e.event = 'attempt.failed'
				WHERE s.task_id = $1`, id).Scan(&attempts, &class))
			require.Equal(t, 2, attempts)
			require.Equal(t, "stalled", class)
		})
	}
}

// processAlive reports whether process pid exists and is not a zombie.
func processAlive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name: "pid (comm) S …".
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}
