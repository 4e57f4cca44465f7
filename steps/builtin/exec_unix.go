//go:build unix

package builtin

import (
	"os/exec"
	"syscall"
)

// killProcessGroupOnCancel runs cmd in a process group of its own and makes the cancellation of its context
// kill that whole group with SIGKILL, so that a shell's children die with it instead of holding its output open
// or running on unsupervised.
func killProcessGroupOnCancel(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
