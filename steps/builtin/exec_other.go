//go:build !unix

package builtin

import "os/exec"

// killProcessGroupOnCancel leaves cmd as exec.CommandContext made it: without process groups, the cancellation
// of its context kills the process only.
func killProcessGroupOnCancel(*exec.Cmd) {}
