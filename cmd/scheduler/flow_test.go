package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFlowCommands(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	stdout, _, err := b.run("flow", "list", "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, `[]`, stdout)

	// Three steps of tenant:7 (limit 2), one claimed; a rate key with a burst of 1, used once.
	b.exec(`SELECT stepready.create_task('{"name": "t", "context": {"tenant": 7},
		"concurrency": {"key": "tenant:${context.tenant}", "limit": 2},
		"steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"}, {"name": "c", "handler": "h"}]}')`)
	b.exec(`SELECT stepready.create_task('{"name": "u", "rate_limit": {"key": "api", "limit": 1, "period_ms": 60000},
		"steps": [{"name": "api", "handler": "h"}, {"name": "api2", "handler": "h"}]}')`)
	b.exec(`SELECT count(*) FROM stepready.claim_ready_steps(10, 'w', 60000)`)

	stdout, stderr, err := b.run("flow", "list")
	require.NoError(t, err, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 3, stdout)
	require.Regexp(t, `^KEY\s+CONCURRENCY\s+IN FLIGHT\s+RATE\s+TOKENS\s+NEXT TOKEN\s+WAITING\s+BLOCKED\s+OVERRIDE$`, lines[0])
	// The token refills at 1 per minute from the claim on: a slow machine may show 0.01 and a next token in 5x s.
	require.Regexp(t, `^api\s+-\s+0\s+1/1m0s\s+0\.0\d\s+in (5\d\.\d|60\.0)s\s+1\s+rate_limited\s+no$`, lines[1])
	require.Regexp(t, `^tenant:7\s+2\s+2\s+-\s+-\s+-\s+1\s+concurrency_limited\s+no$`, lines[2])

	stdout, stderr, err = b.run("flow", "set", "tenant:7", "--concurrency", "3")
	require.NoError(t, err, stderr)
	require.Equal(t, "flow key tenant:7: override set (applies from the next claim)\n", stdout)
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT count(*)::int FROM stepready.claim_ready_steps(10, 'w', 60000)`).Scan(&n))
	require.Equal(t, 1, n, "the raised limit applies at the next claim")
	stdout, _, err = b.run("flow", "list", "-o", "json")
	require.NoError(t, err)
	require.Contains(t, stdout, `"key": "tenant:7",
    "concurrency_limit": 3,
    "in_flight": 3,`)
	require.Contains(t, stdout, `"overridden": true`)

	_, _, err = b.run("flow", "set", "api", "--rate", "5", "--period", "1s", "-o", "json")
	require.NoError(t, err)
	stdout, _, err = b.run("flow", "set", "api", "--clear")
	require.NoError(t, err)
	require.Equal(t, "flow key api: override cleared\n", stdout)
	stdout, _, err = b.run("flow", "set", "api", "--clear")
	require.NoError(t, err)
	require.Equal(t, "flow key api had no override\n", stdout)

	// A key never claimed shows its steps' limit.
	b.exec(`SELECT stepready.create_task('{"name": "v", "concurrency": {"key": "fresh", "limit": 4},
		"steps": [{"name": "a", "handler": "h"}]}')`)
	stdout, _, err = b.run("flow", "list")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^fresh\s+4\s+0\s+-\s+-\s+-\s+1\s+-\s+no$`, stdout)

	for _, args := range [][]string{
		{"flow", "set", "k"},
		{"flow", "set", "k", "--concurrency", "0"},
		{"flow", "set", "k", "--rate", "5"},
		{"flow", "set", "k", "--rate", "5", "--period", "0s"},
		{"flow", "set", "k", "--concurrency", "1", "--clear"},
		{"flow", "set", "", "--concurrency", "1"},
	} {
		_, _, err := b.run(args...)
		require.Error(t, err, args)
		require.Equal(t, 2, exitCode(err), "%v: %v", args, err)
	}
}

// task show and explain name the key and the count of a step held by flow control.
func TestFlowInTaskShowAndExplain(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	b.exec(`SELECT stepready.create_task('{"name": "t", "concurrency": {"key": "tenant:9", "limit": 1},
		"steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"}]}')`)
	b.exec(`SELECT count(*) FROM stepready.claim_ready_steps(10, 'w', 60000)`)
	stdout, stderr, err := b.run("task", "show", "1")
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, "concurrency limited by tenant:9: 1 of 1 in flight")
	stdout, _, err = b.run("task", "show", "1", "-o", "json")
	require.NoError(t, err)
	require.Contains(t, stdout, `"why": "concurrency limited by tenant:9: 1 of 1 in flight"`)
	stdout, stderr, err = b.run("explain", "1")
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, "concurrency limited by tenant:9: 1 of 1 in flight")
}
