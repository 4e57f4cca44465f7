package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// envBundle runs the command line with a fake environment and captures the resolved `run` flags instead of
// starting a daemon.
type envBundle struct {
	env      map[string]string
	resolved *runParams
	opts     *globalOptions
	stdout   bytes.Buffer
	stderr   bytes.Buffer
}

func setupEnv(t *testing.T, env map[string]string) *envBundle {
	t.Helper()
	b := &envBundle{env: env}
	b.opts = &globalOptions{
		stdout: &b.stdout,
		stderr: &b.stderr,
		lookupEnv: func(name string) (string, bool) {
			v, ok := b.env[name]
			return v, ok
		},
		exit: func(code int) { t.Errorf("exit(%d) called", code) },
		daemon: func(_ context.Context, p *runParams) error {
			b.resolved = p
			return nil
		},
	}
	return b
}

func (b *envBundle) execute(args ...string) error {
	root := newRootCommandWith(b.opts)
	root.SetArgs(args)
	return root.ExecuteContext(context.Background())
}

// runDefaults are the resolved flags of `run --database-url postgres://db` with an empty environment.
func runDefaults() runParams {
	return runParams{
		databaseURL: "postgres://db",
		waitForDB:   waitForever,
		daemon: daemonFlags{
			dispatch:          stepready.DispatchRiver,
			concurrency:       stepready.ConcurrencyDefault,
			queues:            stepready.QueuesDefault(),
			lease:             stepready.LeaseDefault,
			reapInterval:      stepready.ReapIntervalDefault,
			pollInterval:      stepready.PollIntervalDefault,
			probeInterval:     stepready.ProbeIntervalDefault,
			shutdownGrace:     stepready.ShutdownGraceDefault,
			retentionComplete: stepready.RetentionCompleteDefault,
			retentionFailed:   stepready.RetentionFailedDefault,
			pruneInterval:     stepready.PruneIntervalDefault,
			scheduleInterval:  stepready.ScheduleIntervalDefault,
			backlogInterval:   stepready.BacklogIntervalDefault,
			maxOutputBytes:    steps.MaxOutputBytesDefault,
		},
	}
}

func TestRunFlagsDefaultEnvAndPrecedence(t *testing.T) {
	t.Parallel()

	everyVariable := map[string]string{
		"DATABASE_URL":                 "postgres://from-env",
		"STEPREADY_DISPATCH":           "direct",
		"STEPREADY_CONCURRENCY":        "7",
		"STEPREADY_QUEUES":             "media,high-priority",
		"STEPREADY_LEASE":              "45s",
		"STEPREADY_REAP_INTERVAL":      "3s",
		"STEPREADY_POLL_INTERVAL":      "250ms",
		"STEPREADY_PROBE_INTERVAL":     "off",
		"STEPREADY_SHUTDOWN_GRACE":     "0s",
		"STEPREADY_WORKER_ID":          "worker-env",
		"STEPREADY_METRICS_ADDR":       "127.0.0.1:9999",
		"STEPREADY_POLL_ONLY":          "true",
		"STEPREADY_RETENTION_COMPLETE": "24h",
		"STEPREADY_RETENTION_FAILED":   "0",
		"STEPREADY_PRUNE_INTERVAL":     "5m",
		"STEPREADY_SCHEDULE_INTERVAL":  "off",
		"STEPREADY_BACKLOG_INTERVAL":   "-1",
		"STEPREADY_HTTP_DENY_PRIVATE":  "true",
		"STEPREADY_HTTP_ALLOW_HOSTS":   "api.internal,10.0.0.0/8",
		"STEPREADY_MAX_OUTPUT_BYTES":   "2048",
		"STEPREADY_ALLOW_EXEC":         "1",
		"STEPREADY_LOG_FORMAT":         "json",
		"STEPREADY_LOG_LEVEL":          "debug",
		"STEPREADY_WAIT_FOR_DB":        "90s",
	}
	fromEveryVariable := runParams{
		databaseURL: "postgres://from-env",
		metricsAddr: "127.0.0.1:9999",
		allowExec:   true,
		waitForDB:   waitBound{d: 90 * time.Second},
		daemon: daemonFlags{dispatch: "direct", concurrency: 7, queues: []string{"media", "high-priority"},
			lease: 45 * time.Second, reapInterval: 3 * time.Second,
			pollInterval: 250 * time.Millisecond, probeInterval: stepready.Off, shutdownGrace: 0, workerID: "worker-env",
			pollOnly:          true,
			retentionComplete: 24 * time.Hour, retentionFailed: stepready.KeepForever, pruneInterval: 5 * time.Minute,
			scheduleInterval: stepready.Off, backlogInterval: stepready.Off,
			httpDenyPrivate: true, httpAllowHosts: []string{"api.internal", "10.0.0.0/8"}, maxOutputBytes: 2048},
	}

	tests := []struct {
		name      string
		env       map[string]string
		args      []string
		want      func(p *runParams)
		logLevel  string
		logFormat string
	}{
		{name: "defaults", args: []string{"--database-url", "postgres://db"}, logLevel: "info", logFormat: "text"},
		{name: "every flag from the environment", env: everyVariable,
			want: func(p *runParams) { *p = fromEveryVariable }, logLevel: "debug", logFormat: "json"},
		{name: "flags beat the environment", env: everyVariable,
			args: []string{"--database-url", "postgres://db", "--dispatch", "river", "--concurrency", "3",
				"--queues", "default,emails",
				"--lease", "1m", "--reap-interval", "20s", "--poll-interval", "2s", "--probe-interval", "40ms",
				"--shutdown-grace", "4s",
				"--worker-id", "worker-flag", "--metrics-addr", ":9090", "--poll-only=false", "--allow-exec=false",
				"--log-format", "text", "--log-level", "warn", "--retention-complete", "1h", "--retention-failed", "2h",
				"--prune-interval", "10s", "--http-deny-private=false", "--http-allow-hosts", "a.example",
				"--max-output-bytes", "4096", "--schedule-interval", "2s", "--backlog-interval", "30s",
				"--wait-for-db", "0"},
			want: func(p *runParams) {
				p.metricsAddr = ":9090"
				p.waitForDB = waitBound{}
				p.daemon = daemonFlags{dispatch: "river", concurrency: 3, queues: []string{"default", "emails"},
					lease:        time.Minute,
					reapInterval: 20 * time.Second, pollInterval: 2 * time.Second, probeInterval: 40 * time.Millisecond,
					shutdownGrace: 4 * time.Second,
					workerID:      "worker-flag", retentionComplete: time.Hour, retentionFailed: 2 * time.Hour,
					pruneInterval: 10 * time.Second, scheduleInterval: 2 * time.Second, backlogInterval: 30 * time.Second,
					httpAllowHosts: []string{"a.example"}, maxOutputBytes: 4096}
			}, logLevel: "warn", logFormat: "text"},
		{name: "STEPREADY_DATABASE_URL beats DATABASE_URL",
			env:  map[string]string{"STEPREADY_DATABASE_URL": "postgres://db", "DATABASE_URL": "postgres://other"},
			want: func(*runParams) {}, logLevel: "info", logFormat: "text"},
		{name: "wait for the database forever", env: map[string]string{"DATABASE_URL": "postgres://db",
			"STEPREADY_WAIT_FOR_DB": "1m"}, args: []string{"--wait-for-db", "forever"},
			want: func(*runParams) {}, logLevel: "info", logFormat: "text"},
		{name: "empty variables are unset",
			env: map[string]string{"STEPREADY_DATABASE_URL": " ", "DATABASE_URL": "postgres://db",
				"STEPREADY_CONCURRENCY": ""},
			want: func(*runParams) {}, logLevel: "info", logFormat: "text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupEnv(t, tt.env)
			require.NoError(t, b.execute(append([]string{"run"}, tt.args...)...))
			want := runDefaults()
			if tt.want != nil {
				tt.want(&want)
			}
			require.Equal(t, want, *b.resolved)
			require.Equal(t, tt.logLevel, b.opts.logLevel)
			require.Equal(t, tt.logFormat, b.opts.logFormat)
		})
	}
}

func TestRunRejectsBadFlagsWithExitStatus2(t *testing.T) {
	t.Parallel()
	db := []string{"--database-url", "postgres://db"}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{name: "no database", env: map[string]string{}, want: "pass --database-url or set DATABASE_URL"},
		{name: "dispatch", args: []string{"--dispatch", "kafka"}, want: `--dispatch "kafka": must be "river" or "direct"`},
		{name: "concurrency", args: []string{"--concurrency", "0"}, want: "--concurrency 0: must be 1 or more"},
		{name: "queue name", args: []string{"--queues", "default,Media"},
			want: `--queues "Media": must be a queue name: at most 64 lowercase letters and digits`},
		{name: "queue twice", args: []string{"--queues", "a,b,a"}, want: `--queues "a": is listed twice`},
		{name: "no queue", args: []string{"--queues", ""}, want: `--queues: name at least one queue`},
		{name: "lease", args: []string{"--lease", "100ms"}, want: "--lease 100ms: must be at least 300ms"},
		{name: "reap interval vs lease", args: []string{"--lease", "5s"},
			want: "--reap-interval 10s: must be more than 0 and shorter than --lease (5s), or off"},
		{name: "poll interval", args: []string{"--poll-interval", "0s"}, want: "--poll-interval 0s: must be more than 0"},
		{name: "shutdown grace", args: []string{"--shutdown-grace", "-1s"}, want: "--shutdown-grace -1s: must be 0 or more"},
		{name: "retention complete", args: []string{"--retention-complete", "-1s"},
			want: "--retention-complete -1s: must be more than 0, or 0 (keep forever)"},
		{name: "retention failed", args: []string{"--retention-failed", "-2h"},
			want: "--retention-failed -2h0m0s: must be more than 0, or 0 (keep forever)"},
		{name: "prune interval", args: []string{"--prune-interval", "0s"}, want: "--prune-interval 0s: must be more than 0"},
		{name: "negative interval", args: []string{"--backlog-interval", "-5s"},
			want: "--backlog-interval -5s: must be more than 0, or off"},
		{name: "off reap interval", args: []string{"--reap-interval", "nope"}, want: "want a duration (90s, 5m, 24h) or off"},
		{name: "max output bytes", args: []string{"--max-output-bytes", "0"}, want: "--max-output-bytes 0: must be 1 or more"},
		{name: "log format", args: []string{"--log-format", "xml"}, want: `--log-format "xml": want text or json`},
		{name: "log level", args: []string{"--log-level", "loud"}, want: `--log-level "loud"`},
		{name: "not a number", args: []string{"--concurrency", "many"}, want: `invalid argument "many" for "--concurrency"`},
		{name: "wait for db", args: []string{"--wait-for-db", "soon"},
			want: `invalid argument "soon" for "--wait-for-db" flag: want a duration (30s, 5m; 0 fails at once) or forever`},
		{name: "negative wait for db", args: []string{"--wait-for-db=-1s"}, want: "-1s: must be 0 or more (or forever)"},
		{name: "unknown flag", args: []string{"--colour"}, want: "unknown flag: --colour"},
		{name: "argument", args: []string{"now"}, want: `unknown command "now"`},
		{name: "bad environment value", env: map[string]string{"STEPREADY_LEASE": "soon"},
			want: `STEPREADY_LEASE="soon" (for --lease)`},
		{name: "invalid environment value", env: map[string]string{"STEPREADY_CONCURRENCY": "-2"},
			want: "--concurrency -2: must be 1 or more"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupEnv(t, tt.env)
			args := []string{"run"}
			if tt.env == nil {
				args = append(args, db...)
			}
			err := b.execute(append(args, tt.args...)...)
			require.ErrorContains(t, err, tt.want)
			require.Equal(t, 2, exitCode(err), "%v", err)
			require.Nil(t, b.resolved, "the daemon does not start")
		})
	}
}

// runFlags are exactly the flags of `scheduler run` (SPEC §11 and the interface list; cobra adds --help
// when the command runs).
var runFlags = []string{"allow-exec", "concurrency", "database-url", "dispatch", "lease", "metrics-addr",
	"poll-interval", "probe-interval", "poll-only", "prune-interval", "reap-interval", "retention-complete", "retention-failed",
	"shutdown-grace", "worker-id", "http-deny-private", "http-allow-hosts", "max-output-bytes", "sql-database-url",
	"ui-addr", "ui-allow-actions", "ui-token", "schedule-interval", "backlog-interval", "wait-for-db", "queues"}

func TestRunHasExactlyTheDocumentedFlags(t *testing.T) {
	t.Parallel()
	run, _, err := newRootCommand(&bytes.Buffer{}, &bytes.Buffer{}).Find([]string{"run"})
	require.NoError(t, err)
	var names []string
	run.LocalFlags().VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	require.ElementsMatch(t, runFlags, names)
}

func TestHelpShowsEveryFlagWithDefaultAndEnvironmentVariable(t *testing.T) {
	t.Parallel()
	for _, path := range [][]string{{"run"}, {"demo"}, {"migrate", "up"}, {"migrate", "down"}} {
		t.Run(strings.Join(path, " "), func(t *testing.T) {
			t.Parallel()
			stdout, _, err := execute(t, append(path, "--help")...)
			require.NoError(t, err)
			help := strings.Join(strings.Fields(stdout), " ") // wrapping aside

			cmd, _, err := newRootCommand(&bytes.Buffer{}, &bytes.Buffer{}).Find(path)
			require.NoError(t, err)
			checked := 0
			check := func(f *pflag.Flag) {
				if f.Name == "help" {
					return
				}
				checked++
				require.Contains(t, help, "--"+f.Name+" ")
				env := "STEPREADY_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
				require.Contains(t, help, "; env "+env, f.Name)
				require.Contains(t, help, "(default "+defaultText(f)+"; env "+env, f.Name)
			}
			cmd.LocalFlags().VisitAll(check)
			cmd.InheritedFlags().VisitAll(check)
			require.Positive(t, checked)
		})
	}

	stdout, _, err := execute(t, "run", "--help")
	require.NoError(t, err)
	help := strings.Join(strings.Fields(stdout), " ")
	for _, want := range []string{
		"--lease duration", "(default 30s; env STEPREADY_LEASE)",
		`(default "river"; env STEPREADY_DISPATCH)`,
		"(default 10; env STEPREADY_CONCURRENCY)",
		"(default 10s; env STEPREADY_REAP_INTERVAL)",
		"(default 5s; env STEPREADY_POLL_INTERVAL)",
		"(default 10s; env STEPREADY_SHUTDOWN_GRACE)",
		"(default hostname-pid; env STEPREADY_WORKER_ID)",
		"(default false; env STEPREADY_POLL_ONLY)",
		"(default false; env STEPREADY_ALLOW_EXEC)",
		`(default ""; env STEPREADY_METRICS_ADDR)`,
		`(default "text"; env STEPREADY_LOG_FORMAT)`,
		"(default none; env STEPREADY_DATABASE_URL, DATABASE_URL)",
	} {
		require.Contains(t, help, want)
	}
}

func TestEnvironmentReachesEveryCommand(t *testing.T) {
	t.Parallel()
	// migrate down's --steps is read from STEPREADY_STEPS like any flag.
	b := setupEnv(t, map[string]string{"STEPREADY_STEPS": "-3", "DATABASE_URL": "postgres://db"})
	err := b.execute("migrate", "down")
	require.ErrorContains(t, err, "--steps -3")
	require.Equal(t, 2, exitCode(err))
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	require.Equal(t, 0, exitCode(nil))
	require.Equal(t, 1, exitCode(errors.New("database down")))
	require.Equal(t, 2, exitCode(usagef("--lease: bad")))
	require.Equal(t, 2, exitCode(errors.Join(errors.New("x"), usagef("bad"))))
}

func TestWrapWords(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"one two", "three", "fourfourfour"}, wrapWords("one two three fourfourfour", 8))
	require.Equal(t, []string{""}, wrapWords("", 8))
}

// A second SIGINT while the daemon stops gracefully ends the process at once with status 1. Not parallel: it
// signals the test process itself (caught by watchSignals, which is armed first).
func TestSecondSignalExitsAtOnce(t *testing.T) {
	exited := make(chan int, 1)
	said := make(chan string, 2)
	o := &globalOptions{stderr: chanWriter(said), exit: func(code int) { exited <- code }}
	disarm := o.watchSignals()
	defer disarm()

	// Signals of one kind do not queue: send the second once the first was received.
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGINT))
	select {
	case msg := <-said:
		require.Contains(t, msg, "stopping gracefully; send it again to exit at once")
	case <-time.After(10 * time.Second):
		t.Fatal("the first signal was not noticed")
	}
	require.Empty(t, exited, "the first signal does not exit")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGINT))
	select {
	case code := <-exited:
		require.Equal(t, 1, code)
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after the second signal")
	}
}

// chanWriter sends every write to its channel.
type chanWriter chan string

func (c chanWriter) Write(p []byte) (int, error) {
	c <- string(p)
	return len(p), nil
}
