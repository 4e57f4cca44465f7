//go:build linux

package builtin

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// An `exec` command dies with its daemon, children included. The command runs in a process group of its own
// (exec_unix.go: so that a cancelled attempt kills its children too, and a terminal's Ctrl-C does not reach it),
// which also means nothing would stop it when the daemon is killed (kill -9, the OOM killer): the reaper would
// retry the step while the first copy still ran. Two mechanisms stop it:
//
//   - The command gets the parent-death signal SIGKILL (prctl PR_SET_PDEATHSIG). The kernel sends it when the
//     *thread* that forked the command exits, not the process (golang/go#27505): a Go thread exits whenever a
//     goroutine ends while locked to it, in this program or any library. So the goroutine that starts the
//     command stays locked to its thread until the command has been waited for: that thread cannot exit before.
//     The signal reaches the command only, not its children.
//   - A watchdog process, a re-execution of this program's own binary (/proc/self/exe, caught by this file's
//     init before main runs), holds the read end of a pipe whose only write end is the daemon's (close-on-exec,
//     so no command inherits it). The daemon writes the command's process group to it. When the daemon dies,
//     however it dies, the kernel closes the write end; the watchdog reads end of file and kills the whole
//     process group with SIGKILL. It ignores SIGINT, SIGTERM and SIGHUP and runs in a process group of its own,
//     so that only the daemon (or SIGKILL) ends it. When the command has been waited for, the daemon kills the
//     watchdog first and then closes the pipe: a command's background processes that outlive it normally are
//     left alone, as before.
//
// A descendant that leaves the process group (setsid, a double-forking daemon) is not followed.

// watchdogName is the watchdog's argv[0] (what ps shows) and, with watchdogEnv=1, what makes init run it.
const (
	watchdogName = "stepready-exec-watchdog"
	watchdogEnv  = "STEPREADY_EXEC_WATCHDOG"
)

// watchdogExe is this program's own binary, re-executed as the watchdog.
const watchdogExe = "/proc/self/exe"

func init() {
	if len(os.Args) == 1 && os.Args[0] == watchdogName && os.Getenv(watchdogEnv) == "1" {
		os.Exit(runWatchdog(os.Stdin))
	}
}

// runWatchdog is the watchdog process: it reads the process group of the command it watches (a decimal line),
// then waits for end of file on in, which comes when the daemon's end of the pipe is closed, and kills the
// group. End of file before the group is known means the daemon died before the command started (or could not
// start it): there is nothing to kill.
func runWatchdog(in io.Reader) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	r := bufio.NewReader(in)
	line, err := r.ReadString('\n')
	if err != nil {
		return 0
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pgid <= 1 {
		return 2
	}
	_, _ = io.Copy(io.Discard, r)
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return 0
}

// watchdog is the daemon's side of a started watchdog process.
type watchdog struct {
	cmd  *exec.Cmd
	pipe *os.File // the pipe's write end
}

// startWatchdog starts a watchdog process.
func startWatchdog() (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("exec handler: watchdog pipe: %w", err)
	}
	cmd := &exec.Cmd{Path: watchdogExe, Args: []string{watchdogName}, Env: []string{watchdogEnv + "=1"}, Dir: "/",
		Stdin: r, SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
	err = cmd.Start()
	_ = r.Close()
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("exec handler: start the watchdog (%s): %w", watchdogExe, err)
	}
	return &watchdog{cmd: cmd, pipe: w}, nil
}

// watch tells the watchdog the process group to kill if the daemon dies.
func (wd *watchdog) watch(pgid int) error {
	if _, err := fmt.Fprintf(wd.pipe, "%d\n", pgid); err != nil {
		return fmt.Errorf("exec handler: watchdog: %w", err)
	}
	return nil
}

// dismiss ends the watchdog without letting it kill anything: it is killed and reaped before its pipe closes.
func (wd *watchdog) dismiss() {
	_ = wd.cmd.Process.Kill()
	_ = wd.cmd.Wait()
	_ = wd.pipe.Close()
}

// runCommand starts cmd under a watchdog, with the parent-death signal, and waits for it; startErr is set when it
// did not start, or was killed at once because its watchdog could not be told its process group.
func runCommand(cmd *exec.Cmd) (startErr, waitErr error) {
	// The thread that forks the command must outlive it (see above): this goroutine keeps it until Wait returned.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	wd, err := startWatchdog()
	if err != nil {
		return err, nil
	}
	defer wd.dismiss()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return err, nil
	}
	// The command leads its own process group (killProcessGroupOnCancel, exec_unix.go): its pid is the group's id.
	if err := wd.watch(cmd.Process.Pid); err != nil {
		// A watchdog that cannot be told could not stop the command if the daemon died: stop it now.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return err, nil
	}
	return nil, cmd.Wait()
}
