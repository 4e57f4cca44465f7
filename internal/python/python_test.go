package python_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/python"
)

func TestFindNamesEveryCandidateWhenNoneImportsTheModules(t *testing.T) {
	t.Setenv(python.EnvVar, "")
	_, err := python.Find("stepready_no_such_module_anywhere")
	require.Error(t, err)
	require.Contains(t, err.Error(), "No module named 'stepready_no_such_module_anywhere'")
	require.Contains(t, err.Error(), "apt-get install python3-psycopg python3-pytest")
}

func TestFindTakesOnlyTheInterpreterTheEnvironmentNames(t *testing.T) {
	// A "python" that fails every import: Find must say so and not fall back to another interpreter.
	fake := filepath.Join(t.TempDir(), "python3")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\necho 'ModuleNotFoundError: nothing here' >&2\nexit 1\n"), 0o755))
	t.Setenv(python.EnvVar, fake)
	_, err := python.Find("sys")
	require.ErrorContains(t, err, fake+": ModuleNotFoundError: nothing here")
}

func TestFindAcceptsAnInterpreterThatImportsTheModules(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "python3")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\nexit 0\n"), 0o755))
	t.Setenv(python.EnvVar, fake)
	got, err := python.Find("psycopg")
	require.NoError(t, err)
	require.Equal(t, fake, got)
}
