package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// BenchmarkTasksPageMillion measures the server time of the tasks page over 1,000,000 tasks (made by one
// generate_series INSERT, then ANALYZE): the first page, a page deep in the keyset, a filter by status and one
// by name. Above estimateThreshold the counts per status are the planner's estimates. Run it with
//
//	go test -run '^$' -bench TasksPageMillion -benchtime 50x ./console
func BenchmarkTasksPageMillion(b *testing.B) {
	db := pgtest.New(b)
	ctx := b.Context()
	started := time.Now()
	_, err := db.Pool.Exec(ctx, `INSERT INTO stepready.tasks (name, namespace, status, steps_total)
		SELECT 'task' || (g % 1000), 'ns' || (g % 10),
		       (ARRAY['complete', 'complete', 'complete', 'error', 'pending', 'in_progress', 'cancelled'])[1 + g % 7], 1
		  FROM generate_series(1, 1000000) g`)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `VACUUM (ANALYZE) stepready.tasks`)
	require.NoError(b, err)
	b.Logf("fixture: 1,000,000 tasks in %s", time.Since(started).Round(time.Millisecond))

	c, err := New(db.Pool, Options{})
	require.NoError(b, err)
	b.Cleanup(c.Close)

	for _, bc := range []struct{ name, path string }{
		{"first_page", "/"},
		{"deep_page", "/?after=500000"},
		{"status_pending", "/?status=pending"},
		{"name", "/?name=task42"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				rec := httptest.NewRecorder()
				c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, bc.path, nil))
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: status %d: %s", bc.path, rec.Code, rec.Body.String())
				}
				_, _ = io.Copy(io.Discard, rec.Body)
			}
		})
	}
}
