//go:build !linux

package builtin

import "os/exec"

// runCommand starts cmd and waits for it; startErr is set when it did not start. Outside Linux nothing ties the
// command's life to the daemon's: a daemon killed with SIGKILL leaves it running (docs/security.md).
func runCommand(cmd *exec.Cmd) (startErr, waitErr error) {
	if err := cmd.Start(); err != nil {
		return err, nil
	}
	return nil, cmd.Wait()
}
