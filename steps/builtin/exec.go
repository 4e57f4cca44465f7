package builtin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/stepready/stepready/steps"
)

// MaxExecOutputBytes is how much of each of a command's stdout and stderr the `exec` handler keeps (10 MiB);
// the rest is read and discarded, so the command never blocks on a full pipe.
const MaxExecOutputBytes = 10 << 20

// execStderrTailBytes is how much of the end of stderr goes into the message of a failed command.
const execStderrTailBytes = 1024

// execWaitDelay bounds how long the handler waits for the command's output pipes to close once the command
// has exited or been killed (a daemonized grandchild may hold them open).
const execWaitDelay = 5 * time.Second

// execInput is the input of the `exec` handler.
type execInput struct {
	// Command is the program and its arguments, run without a shell. Required.
	Command []string `json:"command"`
	// Dir is the working directory; default the scheduler's.
	Dir string `json:"dir"`
	// Env is added to (and overrides) the scheduler's environment.
	Env map[string]string `json:"env"`
	// Stdin is written to the command's standard input; absent means empty input.
	Stdin *string `json:"stdin"`
}

// execOutput is the output of the `exec` handler.
type execOutput struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
}

// errExecDisabled is the failure of every `exec` attempt when Options.AllowExec is false.
var errExecDisabled = errors.New("exec handler is disabled: start the scheduler with --allow-exec " +
	"(builtin.Options.AllowExec) to let steps run commands on its host")

// handleExecDisabled is the `exec` handler when running commands is not allowed: every attempt fails
// permanently.
func handleExecDisabled(context.Context, *steps.Step) (any, error) {
	return nil, &steps.Error{Class: steps.ClassPermanent, Code: "exec_disabled", Err: errExecDisabled}
}

// execHandler is the `exec` handler when running commands is allowed.
type execHandler struct{}

// Handle implements steps.Handler.
func (h *execHandler) Handle(ctx context.Context, step *steps.Step) (any, error) {
	in, err := decodeExecInput(step)
	if err != nil {
		return nil, err
	}

	cmd := exec.CommandContext(ctx, in.Command[0], in.Command[1:]...)
	cmd.Dir = in.Dir
	if len(in.Env) > 0 {
		cmd.Env = os.Environ()
		for _, k := range slices.Sorted(maps.Keys(in.Env)) {
			cmd.Env = append(cmd.Env, k+"="+in.Env[k]) // a later entry wins over the inherited one
		}
	}
	if in.Stdin != nil {
		cmd.Stdin = strings.NewReader(*in.Stdin)
	}
	stdout, stderr := &cappedBuffer{max: MaxExecOutputBytes}, &cappedBuffer{max: MaxExecOutputBytes}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	killProcessGroupOnCancel(cmd)
	cmd.WaitDelay = execWaitDelay

	name := strconv.Quote(in.Command[0])
	startErr, waitErr := runCommand(cmd)
	if err := startErr; err != nil {
		err = fmt.Errorf("exec handler: start %s: %w", name, err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, exec.ErrDot) || errors.Is(err, fs.ErrNotExist) ||
			errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOEXEC) {
			return nil, steps.Permanent(err)
		}
		return nil, classifyExecContext(ctx, err)
	}
	if ctx.Err() != nil {
		return nil, classifyExecContext(ctx, fmt.Errorf("exec handler: %s: %w", name, ctx.Err()))
	}

	out := execOutput{Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: cmd.ProcessState.ExitCode()}
	if out.ExitCode == 0 {
		// waitErr may be exec.ErrWaitDelay: the command succeeded, but something it started kept its output
		// open; what it wrote until then is the output.
		return out, nil
	}
	msg := fmt.Sprintf("exec handler: %s: %s", name, cmd.ProcessState)
	if waitErr != nil && !errors.As(waitErr, new(*exec.ExitError)) {
		msg += " (" + waitErr.Error() + ")"
	}
	if tail := stderrTail(out.Stderr); tail != "" {
		msg += ": " + tail
	}
	return nil, &steps.Error{Class: steps.ClassTransient, Code: strconv.Itoa(out.ExitCode), Err: errors.New(msg)}
}

// decodeExecInput decodes and checks the input of the `exec` handler, starting nothing; a bad input is a
// permanent error naming the field.
func decodeExecInput(step *steps.Step) (execInput, error) {
	var in execInput
	if err := decodeInput(step, &in); err != nil {
		return in, err
	}
	return in, validateExecInput(step, &in)
}

// validateExecInput checks what the operating system would refuse with a less clear error. All of it is
// permanent: a missing working directory is a deployment problem that retries do not fix.
func validateExecInput(step *steps.Step, in *execInput) error {
	if len(in.Command) == 0 {
		return badInput(step, "command", `required: ["program", "arg", …]`)
	}
	if in.Command[0] == "" {
		return badInput(step, "command", "the program (command[0]) is empty")
	}
	for i, arg := range in.Command {
		if strings.ContainsRune(arg, 0) {
			return badInput(step, fmt.Sprintf("command[%d]", i), "contains NUL")
		}
	}
	if strings.ContainsRune(in.Dir, 0) {
		return badInput(step, "dir", "contains NUL")
	}
	if in.Dir != "" { // else the failed chdir is reported as the program not being found
		if info, err := os.Stat(in.Dir); err != nil {
			return badInput(step, "dir", "%v", err)
		} else if !info.IsDir() {
			return badInput(step, "dir", "%s is not a directory", in.Dir)
		}
	}
	for k, v := range in.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return badInput(step, "env", "%q: names must be non-empty without = or NUL, values without NUL", k)
		}
	}
	return nil
}

// classifyExecContext classifies err once the context is done: the step's deadline is `timeout`, a cancelled
// context (the daemon is shutting down) is returned as is; otherwise err is `transient`.
func classifyExecContext(ctx context.Context, err error) error {
	switch ctxErr := ctx.Err(); {
	case errors.Is(ctxErr, context.DeadlineExceeded):
		return steps.Fail(steps.ClassTimeout, err)
	case ctxErr != nil:
		return err
	}
	return steps.Fail(steps.ClassTransient, err)
}

// stderrTail returns the end of stderr for an error message: at most execStderrTailBytes, starting on a rune
// boundary, trimmed.
func stderrTail(stderr string) string {
	stderr = strings.TrimSpace(stderr)
	if len(stderr) <= execStderrTailBytes {
		return stderr
	}
	tail := stderr[len(stderr)-execStderrTailBytes:]
	for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
		tail = tail[1:]
	}
	return "…" + tail
}

// cappedBuffer keeps the first max bytes written to it and discards the rest, never failing a write.
type cappedBuffer struct {
	max int
	buf []byte
}

// Write implements io.Writer.
func (b *cappedBuffer) Write(p []byte) (int, error) {
	keep := min(len(p), b.max-len(b.buf))
	b.buf = append(b.buf, p[:keep]...)
	return len(p), nil
}

// String returns what was kept as text (capturedText).
func (b *cappedBuffer) String() string { return capturedText(b.buf) }

// capturedText is bytes a handler captured as text (a command's output, a response body that is not JSON) in the
// form the step's output can hold: invalid UTF-8 and NUL bytes, which PostgreSQL cannot store in a jsonb string,
// become U+FFFD. The capture was not text where they were, so nothing of the text is lost.
func capturedText(b []byte) string {
	s := string(b)
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	return s
}
