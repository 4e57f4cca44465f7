package pgtest

import (
	"context"
	"errors"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stepready/stepready/internal/pgcluster"
)

// Bouncer is a PgBouncer in transaction pooling mode in front of the test server, for one test.
type Bouncer struct {
	b *pgcluster.PgBouncer
}

// PgBouncer starts a PgBouncer in transaction pooling mode in front of the server of the given postgres:// URLs
// (a database's URL, the URLs of LoginRole), which may connect through it with their own user; Bouncer.URL
// gives each its URL through PgBouncer. It is as strict as a production PgBouncer: unknown startup parameters
// are refused and prepared statements are not tracked (only its pool is larger than the default, 40 server
// connections). It is stopped when t ends.
//
// Without a pgbouncer program the test is skipped, or fails when CI=true (.ci/run installs one): a broken
// install must not pass CI unnoticed.
func PgBouncer(t testing.TB, urls ...string) *Bouncer {
	t.Helper()
	if len(urls) == 0 {
		t.Fatal("pgtest: PgBouncer: no URL")
	}
	var users []string
	for _, u := range urls {
		parsed, err := url.Parse(u)
		if err != nil || parsed.User == nil {
			t.Fatalf("pgtest: PgBouncer: %q: want a postgres:// URL with a user", u)
		}
		if name := parsed.User.Username(); !slices.Contains(users, name) {
			users = append(users, name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), operationTimeout)
	defer cancel()
	b, err := pgcluster.StartPgBouncer(ctx, pgcluster.PgBouncerOptions{Upstream: urls[0], Users: users,
		// Enough server connections that the tests measure stepready, not a queue in PgBouncer.
		Settings: []string{"default_pool_size = 40"}})
	if errors.Is(err, pgcluster.ErrNoPgBouncer) {
		if os.Getenv("CI") == "true" {
			t.Fatal("pgtest: no pgbouncer found in CI (install the pgbouncer package; .ci/run does)")
		}
		t.Skip("pgtest: no pgbouncer installed (apt-get install pgbouncer)")
	}
	if err != nil {
		t.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Errorf("pgtest: stop pgbouncer: %v", err)
		}
	})
	return &Bouncer{b: b}
}

// URL returns u (one of the URLs given to PgBouncer) through PgBouncer.
func (b *Bouncer) URL(t testing.TB, u string) string {
	t.Helper()
	through, err := b.b.URL(u)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return through
}

// Log returns what PgBouncer has logged so far.
func (b *Bouncer) Log() string { return b.b.Log() }

// poolerFailure matches what a client of PgBouncer in transaction pooling mode logs, or PgBouncer logs, when the
// client depends on its session: a named prepared statement that another server connection does not have (or
// already has), a startup parameter PgBouncer refuses; and any error a client logs with slog's text handler.
var poolerFailure = regexp.MustCompile(`(?i)prepared statement|unsupported startup parameter|pooler error|level=ERROR`)

// PoolerFailures returns the lines of log (a client's or PgBouncer's) that say something depended on a session
// behind PgBouncer, or any error a client logged; a test behind PgBouncer wants none.
func PoolerFailures(log string) []string {
	var bad []string
	for line := range strings.Lines(log) {
		if poolerFailure.MatchString(line) {
			bad = append(bad, strings.TrimSpace(line))
		}
	}
	return bad
}
