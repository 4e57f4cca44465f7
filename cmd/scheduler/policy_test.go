package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/readmodel"
)

func TestPolicyListAndSimulate(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)

	stdout, stderr, err := b.run("policy", "list")
	require.NoError(t, err, stderr)
	requireGolden(t, "policy_list", stdout)

	stdout, _, err = b.run("policy", "simulate", "standard")
	require.NoError(t, err)
	requireGolden(t, "policy_simulate_standard", stdout)

	// The cap of 30 s applies from the 9th attempt of aggressive (200 ms × 2^8 = 51.2 s).
	stdout, _, err = b.run("policy", "simulate", "aggressive", "--attempts", "10", "-o", "json")
	require.NoError(t, err)
	var sim readmodel.Simulation
	require.NoError(t, json.Unmarshal([]byte(stdout), &sim))
	require.Len(t, sim.Timeline, 10)
	want := []int64{200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000}
	var cumulative int64
	for i, d := range want {
		cumulative += d
		require.True(t, sim.Timeline[i].Retry)
		require.Equal(t, d, *sim.Timeline[i].DelayMs, "attempt %d", i+1)
		require.Equal(t, cumulative, *sim.Timeline[i].CumulativeMs)
	}
	require.False(t, sim.Timeline[9].Retry)
	require.Nil(t, sim.Timeline[9].DelayMs)
	require.Equal(t, cumulative, sim.Timeline[9].StartsAtMs)

	// Flags without a name start from the standard preset; the jitter is the database's, replayable by seed.
	stdout, _, err = b.run("policy", "simulate", "--backoff", "linear", "--base-delay-ms", "500", "--uncapped",
		"--attempts", "4", "--jitter", "0.5", "--jitter-seed", "0.25")
	require.NoError(t, err)
	requireGolden(t, "policy_simulate_jitter", stdout)
	again, _, err := b.run("policy", "simulate", "--backoff", "linear", "--base-delay-ms", "500", "--uncapped",
		"--attempts", "4", "--jitter", "0.5", "--jitter-seed", "0.25")
	require.NoError(t, err)
	require.Equal(t, stdout, again, "the same seed gives the same timeline")

	stdout, _, err = b.run("policy", "simulate", "none")
	require.NoError(t, err)
	require.Contains(t, stdout, "error: not retryable")

	_, _, err = b.run("policy", "simulate", "turbo")
	require.EqualError(t, err, `no retry policy "turbo" (see `+"`scheduler policy list`"+`)`)
	require.Equal(t, 1, exitCode(err))
	_, _, err = b.run("policy", "simulate", "--backoff", "quadratic")
	require.ErrorContains(t, err, `unknown`)
	require.ErrorContains(t, err, `quadratic`)
	require.Equal(t, 1, exitCode(err))
	_, _, err = b.run("policy", "simulate", "--jitter-seed", "7")
	require.Equal(t, 2, exitCode(err))
}

func TestOperatorCommandsReadTheEnvironment(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	env := map[string]string{"DATABASE_URL": b.url, "STEPREADY_OUTPUT": "json"}
	var out, errOut bytes.Buffer
	root := newRootCommandWith(&globalOptions{
		stdout: &out, stderr: &errOut,
		lookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		exit:      func(code int) { t.Errorf("exit(%d) called", code) },
	})
	root.SetArgs([]string{"policy", "list"})
	require.NoError(t, root.ExecuteContext(t.Context()), errOut.String())
	var ps []readmodel.Policy
	require.NoError(t, json.Unmarshal(out.Bytes(), &ps), out.String())
	require.Len(t, ps, 4)
}
