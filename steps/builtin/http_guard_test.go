package builtin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
)

// guardedHandler is the http handler with the default client under guard.
func guardedHandler(t *testing.T, guard HTTPGuard) *httpHandler {
	t.Helper()
	require.NoError(t, guard.Validate())
	client := newDefaultHTTPClient(&guard)
	t.Cleanup(client.CloseIdleConnections)
	return &httpHandler{client: client, now: time.Now, maxBody: 1 << 20}
}

// TestHTTPGuard: the guard checks the resolved address of every connection, redirects included (SPEC §17):
// link-local always refused, loopback and private only with DenyPrivate, AllowHosts exceptions by name, address
// or prefix; a refusal is permanent and names the address.
func TestHTTPGuard(t *testing.T) {
	t.Parallel()
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{}`)) }))
	t.Cleanup(ok.Close)
	port := strings.TrimPrefix(ok.URL, "http://127.0.0.1:")
	redirectTo := func(target string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target, http.StatusFound)
		}))
		t.Cleanup(s.Close)
		return s
	}
	toMetadata := redirectTo("http://169.254.169.254/latest/meta-data/")
	toLoopbackIP := redirectTo(ok.URL)
	byName := func(s *httptest.Server) string { return strings.Replace(s.URL, "127.0.0.1", "localhost", 1) }

	for _, tc := range []struct {
		name   string
		guard  HTTPGuard
		url    string
		denied string // the refused address, or "" when the request goes through
		reason string
	}{
		{"metadata refused always", HTTPGuard{}, "http://169.254.169.254/latest/meta-data/", "169.254.169.254", "link-local"},
		{"IPv6 link-local refused always", HTTPGuard{}, "http://[fe80::1]:80/", "fe80::1", "link-local"},
		{"redirect to metadata refused", HTTPGuard{}, toMetadata.URL, "169.254.169.254", "link-local"},
		{"loopback allowed by default", HTTPGuard{}, ok.URL, "", ""},
		{"loopback refused with deny-private", HTTPGuard{DenyPrivate: true}, ok.URL, "127.0.0.1", "loopback"},
		{"a name resolving to loopback refused", HTTPGuard{DenyPrivate: true}, "http://localhost:" + port + "/", "127.0.0.1", "loopback"},
		{"allowed by address", HTTPGuard{DenyPrivate: true, AllowHosts: []string{"127.0.0.1"}}, ok.URL, "", ""},
		{"allowed by prefix", HTTPGuard{DenyPrivate: true, AllowHosts: []string{"127.0.0.0/8"}}, ok.URL, "", ""},
		{"allowed by name", HTTPGuard{DenyPrivate: true, AllowHosts: []string{"LOCALHOST"}}, "http://localhost:" + port + "/", "", ""},
		{"redirect from an allowed name to a refused address", HTTPGuard{DenyPrivate: true, AllowHosts: []string{"localhost"}},
			byName(toLoopbackIP), "127.0.0.1", "loopback"},
		{"an allowed prefix does not open link-local", HTTPGuard{DenyPrivate: true, AllowHosts: []string{"10.0.0.0/8"}},
			"http://169.254.169.254/", "169.254.169.254", "link-local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := guardedHandler(t, tc.guard)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := run(ctx, h, `{"url": "`+tc.url+`"}`, 1)
			if tc.denied == "" {
				require.NoError(t, err)
				return
			}
			requireClass(t, err, steps.ClassPermanent)
			require.ErrorContains(t, err, "resolves to "+tc.denied+" ("+tc.reason+"): refused")
		})
	}
}

func TestHTTPGuardValidate(t *testing.T) {
	t.Parallel()
	for _, good := range []string{"api.example.com", "10.0.0.1", "10.0.0.0/8", "fd00::/8", "::1"} {
		require.NoError(t, (&HTTPGuard{AllowHosts: []string{good}}).Validate(), good)
	}
	for _, bad := range []string{"", "a b", "10.0.0.0/99", "http://x"} {
		require.Error(t, (&HTTPGuard{AllowHosts: []string{bad}}).Validate(), bad)
	}
}
