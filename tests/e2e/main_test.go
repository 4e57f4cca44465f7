// Package e2e runs the daemon (stepready.Client, both dispatch modes) against a real PostgreSQL.
package e2e

import (
	"os"
	"testing"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		// Re-executed by a test as a separate daemon process (see child_test.go).
		os.Exit(runChildDaemon())
	}
	os.Exit(pgtest.Main(m))
}
