package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/steps/builtin"
)

// lockedBuffer is a bytes.Buffer safe for the daemon's concurrent log writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestSecretsAreNeverStored: an http step's Authorization header given as {"env": "NAME"} is read from the
// daemon's environment when the attempt runs; after a failed attempt whose error echoes the header and a
// successful one whose response echoes it, the secret is in no table of stepready or River and in no log line
// (SPEC §17), in both dispatch modes.
func TestSecretsAreNeverStored(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var raw [12]byte
			_, _ = rand.Read(raw[:])
			secret := "s3cr3t-" + hex.EncodeToString(raw[:])
			name := "STEPREADY_TEST_TOKEN_" + strings.ToUpper(hex.EncodeToString(raw[:4]))
			require.NoError(t, os.Setenv(name, "Bearer "+secret))
			t.Cleanup(func() { _ = os.Unsetenv(name) })

			var calls atomic.Int32
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				echo := r.Header.Get("Authorization")
				if calls.Add(1) == 1 {
					w.WriteHeader(http.StatusServiceUnavailable)
					fmt.Fprintf(w, "upstream down for %s", echo)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("X-Seen", echo)
				fmt.Fprintf(w, `{"you_sent": %q}`, echo)
			}))
			t.Cleanup(api.Close)

			b := setup(t)
			b.reg = steps.NewRegistry()
			require.NoError(t, builtin.Register(b.reg, builtin.Options{}))
			logs := &lockedBuffer{}
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: 100 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			task := b.createTask(t, fmt.Sprintf(`{"name": "secret", "steps": [{"name": "call", "handler": "http",
				"retry": {"max_attempts": 2, "backoff": "fixed", "base_delay_ms": 0},
				"input": {"url": %q, "headers": {"Authorization": {"env": %q}}}}]}`, api.URL, name))
			b.waitTask(t, task, 30*time.Second, "complete")

			var dump string
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT concat_ws(' ',
				(SELECT string_agg(t::text, ' ') FROM stepready.tasks t),
				(SELECT string_agg(s::text, ' ') FROM stepready.steps s),
				(SELECT string_agg(e::text, ' ') FROM stepready.step_events e),
				(SELECT string_agg(j::text, ' ') FROM public.river_job j))`).Scan(&dump))
			require.Contains(t, dump, name, "the step's input names the variable")
			require.Contains(t, dump, "[REDACTED]", "the echoes were redacted")
			require.NotContains(t, dump, secret, "the secret is stored")
			require.NotContains(t, logs.String(), secret, "the secret is logged")
			require.Equal(t, int32(2), calls.Load())
		})
	}
}
