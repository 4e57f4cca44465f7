//go:build unix

package builtin

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

	"github.com/stepready/stepready/steps"
)

// execInputJSON returns the exec handler input for a /bin/sh -c script, with extra fields.
func execInputJSON(t *testing.T, script string, extra map[string]any) string {
	t.Helper()
	in := map[string]any{"command": []string{"/bin/sh", "-c", script}}
	for k, v := range extra {
		in[k] = v
	}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	return string(b)
}

func TestExecSuccess(t *testing.T) {
	t.Parallel()
	h := &execHandler{}
	dir := t.TempDir()
	realDir, err := filepath.EvalSymlinks(dir)
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		script string
		extra  map[string]any
		want   execOutput
	}{
		{name: "Exit0", script: `printf out; printf err >&2`, want: execOutput{Stdout: "out", Stderr: "err"}},
		{name: "Stdin", script: `cat`, extra: map[string]any{"stdin": "hello\n"}, want: execOutput{Stdout: "hello\n"}},
		{name: "NoStdin", script: `cat`, want: execOutput{}},
		{
			name: "Env", script: `printf '%s %s' "$STEP_VAR" "${HOME:+home-inherited}"`,
			extra: map[string]any{"env": map[string]string{"STEP_VAR": "a b"}}, want: execOutput{Stdout: "a b home-inherited"},
		},
		{name: "Dir", script: `pwd -P`, extra: map[string]any{"dir": dir}, want: execOutput{Stdout: realDir + "\n"}},
		{name: "InvalidUTF8", script: `printf '\377ok'`, want: execOutput{Stdout: "\uFFFDok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.name == "Env" && os.Getenv("HOME") == "" {
				t.Skip("HOME is not set")
			}
			out, err := run(context.Background(), h, execInputJSON(t, tc.script, tc.extra), 1)
			require.NoError(t, err)
			var got execOutput
			require.NoError(t, json.Unmarshal([]byte(out), &got))
			require.Equal(t, tc.want, got)
		})
	}

	t.Run("PathLookup", func(t *testing.T) {
		t.Parallel()
		out, err := run(context.Background(), h, `{"command": ["sh", "-c", "printf found"]}`, 1)
		require.NoError(t, err)
		require.JSONEq(t, `{"stdout": "found", "stderr": "", "exit_code": 0}`, out)
	})
}

func TestExecFailure(t *testing.T) {
	t.Parallel()
	h := &execHandler{}
	plain := filepath.Join(t.TempDir(), "plain")
	require.NoError(t, os.WriteFile(plain, []byte("echo hi\n"), 0o644))
	garbage := filepath.Join(t.TempDir(), "garbage")
	require.NoError(t, os.WriteFile(garbage, []byte{0, 1, 2, 3}, 0o755))

	t.Run("Exit3", func(t *testing.T) {
		t.Parallel()
		_, err := run(context.Background(), h, execInputJSON(t, `echo progress; echo "disk full" >&2; exit 3`, nil), 1)
		fail := requireClass(t, err, steps.ClassTransient)
		require.Equal(t, "3", fail.Code)
		require.ErrorContains(t, err, `exec handler: "/bin/sh": exit status 3: disk full`)
		require.NotContains(t, err.Error(), "progress", "stdout is not in the message")
	})

	t.Run("StderrTail", func(t *testing.T) {
		t.Parallel()
		_, err := run(context.Background(), h, execInputJSON(t, `i=0; while [ $i -lt 500 ]; do echo "line $i" >&2; i=$((i+1)); done; exit 1`, nil), 1)
		fail := requireClass(t, err, steps.ClassTransient)
		require.Equal(t, "1", fail.Code)
		require.ErrorContains(t, err, "line 499")
		require.NotContains(t, err.Error(), "line 0\n")
		require.Less(t, len(err.Error()), execStderrTailBytes+200)
	})

	t.Run("KilledBySignal", func(t *testing.T) {
		t.Parallel()
		_, err := run(context.Background(), h, execInputJSON(t, `kill -9 $$`, nil), 1)
		fail := requireClass(t, err, steps.ClassTransient)
		require.Equal(t, "-1", fail.Code)
		require.ErrorContains(t, err, "signal: killed")
	})

	for _, tc := range []struct {
		name, input, wantMsg string
	}{
		{"MissingAbsolute", `{"command": ["/nonexistent/stepready-prog"]}`, "no such file"},
		{"MissingInPath", `{"command": ["stepready-no-such-program", "x"]}`, "executable file not found"},
		{"NotExecutable", `{"command": [` + strconv.Quote(plain) + `]}`, "permission denied"},
		{"NotAProgram", `{"command": [` + strconv.Quote(garbage) + `]}`, "exec format error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := run(context.Background(), h, tc.input, 1)
			requireClass(t, err, steps.ClassPermanent)
			require.ErrorContains(t, err, tc.wantMsg)
		})
	}

	t.Run("Deadline", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := run(ctx, h, execInputJSON(t, `sleep 60`, nil), 1)
		requireClass(t, err, steps.ClassTimeout)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, time.Since(start), execWaitDelay, "the handler returns once the process is killed")
	})
}

// TestExecCancelKillsProcessGroup checks that cancelling the context kills the command's children too: a
// shell's background sleep would otherwise outlive the step.
func TestExecCancelKillsProcessGroup(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	h := &execHandler{}
	pidFile := filepath.Join(t.TempDir(), "pid")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	result := make(chan error, 1)
	go func() {
		_, err := run(ctx, h, execInputJSON(t, `sleep 60 & echo $! > "$PID_FILE.tmp" && mv "$PID_FILE.tmp" "$PID_FILE"; wait`,
			map[string]any{"env": map[string]string{"PID_FILE": pidFile}}), 1)
		result <- err
	}()

	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, err)
		return true
	}, 30*time.Second, 5*time.Millisecond, "the command never wrote its child's pid")
	require.True(t, alive(pid), "the background sleep runs")

	cancel()
	err := <-result
	require.ErrorIs(t, err, context.Canceled)
	_, classified := steps.AsError(err)
	require.False(t, classified, "a cancelled attempt is the context's error, for the daemon to hand back")

	require.Eventually(t, func() bool { return !alive(pid) }, 30*time.Second, 5*time.Millisecond,
		"the background sleep %d survived the cancellation", pid)
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name: "pid (comm) S …".
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
	fields := strings.Fields(rest)
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

func TestExecBadInput(t *testing.T) {
	t.Parallel()
	h := &execHandler{}

	for _, tc := range []struct {
		name, input, field string
	}{
		{"Empty", ``, "command"},
		{"EmptyCommand", `{"command": []}`, "command"},
		{"EmptyProgram", `{"command": [""]}`, "command"},
		{"NULInArg", `{"command": ["/bin/echo", "a\u0000b"]}`, "command[1]"},
		{"NULInDir", `{"command": ["/bin/true"], "dir": "/tmp\u0000x"}`, "dir"},
		{"MissingDir", `{"command": ["/bin/true"], "dir": "/nonexistent/stepready-dir"}`, "dir"},
		{"DirIsAFile", `{"command": ["/bin/true"], "dir": "/bin/sh"}`, "dir"},
		{"EnvNameWithEquals", `{"command": ["/bin/true"], "env": {"A=B": "c"}}`, "env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := run(context.Background(), h, tc.input, 1)
			requireBadInput(t, err, tc.field)
		})
	}

	for _, tc := range []struct {
		name, input, wantMsg string
	}{
		{"UnknownField", `{"cmd": ["/bin/true"]}`, `unknown field "cmd"`},
		{"CommandIsAString", `{"command": "/bin/true"}`, "command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := run(context.Background(), h, tc.input, 1)
			requireClass(t, err, steps.ClassPermanent)
			require.ErrorContains(t, err, tc.wantMsg)
		})
	}
}
