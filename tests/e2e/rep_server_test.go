package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/steps/builtin"
)

// repAPIHost is the host the examples of examples/policies call. The test's HTTP client dials the fake API for
// it, so the YAML files run verbatim.
const repAPIHost = "api.example.test"

// repAPIConfig shapes the fake API's data and misbehaviour.
type repAPIConfig struct {
	// records is how many records each collection holds (ids 1..records).
	records int
	// endless makes every collection claim there is another page, forever (a buggy API).
	endless bool
	// failFirst is how many times each distinct request (method and URI) is answered 503 before it succeeds.
	failFirst int
	// pollsUntilDone is the poll of the export job that first reports it finished (1-based); 0 means never.
	pollsUntilDone int
	// exportOutcome is the final status of the export job: "done" (the default) or "failed".
	exportOutcome string
}

// repAPI is a fake JSON API for the repetition examples: one collection per pagination style and an export job
// to poll. It records every request it receives, failed ones included.
type repAPI struct {
	repAPIConfig
	server *httptest.Server

	mu       sync.Mutex
	requests []repRequest
	seen     map[string]int
	polls    int
}

// repRequest is one request the fake API received.
type repRequest struct {
	// Target is the method and the request URI: "GET /v1/products?page=1&per_page=100".
	Target string
	// Accept is the request's Accept header.
	Accept string
	// Status is the status it was answered with.
	Status int
}

// repNewAPI starts the fake API.
func repNewAPI(t *testing.T, cfg repAPIConfig) *repAPI {
	t.Helper()
	api := &repAPI{repAPIConfig: cfg, seen: map[string]int{}}
	if api.exportOutcome == "" {
		api.exportOutcome = "done"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/products", api.products)
	mux.HandleFunc("GET /v1/users", api.users)
	mux.HandleFunc("GET /v1/events", api.events)
	mux.HandleFunc("GET /v1/orders", api.orders)
	mux.HandleFunc("GET /v1/exports/42", api.export)
	api.server = httptest.NewServer(api.record(mux))
	t.Cleanup(api.server.Close)
	return api
}

// record logs each request and answers 503 to the first failFirst occurrences of each.
func (a *repAPI) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host != repAPIHost {
			http.Error(w, "unexpected host "+r.Host, http.StatusMisdirectedRequest)
			return
		}
		target := r.Method + " " + r.URL.RequestURI()
		a.mu.Lock()
		a.seen[target]++
		fail := a.seen[target] <= a.failFirst
		req := repRequest{Target: target, Accept: r.Header.Get("Accept"), Status: http.StatusOK}
		if fail {
			req.Status = http.StatusServiceUnavailable
		}
		a.requests = append(a.requests, req)
		a.mu.Unlock()
		if fail {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// client returns an HTTP client that sends requests for repAPIHost to the fake API and refuses any other host.
func (a *repAPI) client(t *testing.T) *http.Client {
	addr := a.server.Listener.Addr().String()
	var d net.Dialer
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, hostPort string) (net.Conn, error) {
			if hostPort != repAPIHost+":80" {
				return nil, fmt.Errorf("rep api: refusing to dial %s", hostPort)
			}
			return d.DialContext(ctx, network, addr)
		},
	}
	t.Cleanup(transport.CloseIdleConnections)
	return &http.Client{Transport: transport, Timeout: 10 * time.Second}
}

// register adds the http built-in, sending its requests to the fake API, to reg.
func (a *repAPI) register(t *testing.T, reg *steps.Registry) {
	t.Helper()
	// builtin.Register installs every built-in and reg already has a `noop`: take only `http` from it.
	all := steps.NewRegistry()
	require.NoError(t, builtin.Register(all, builtin.Options{HTTPClient: a.client(t)}))
	h, ok := all.Lookup("http")
	require.True(t, ok)
	reg.MustRegister("http", h)
}

// Requests returns the requests received so far, in order.
func (a *repAPI) Requests() []repRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]repRequest(nil), a.requests...)
}

// Targets returns the targets of the requests received so far, in order.
func (a *repAPI) Targets() []string {
	var out []string
	for _, r := range a.Requests() {
		out = append(out, r.Target)
	}
	return out
}

// ids returns the record ids first..last (inclusive, capped at the collection's size unless endless).
func (a *repAPI) ids(first, last int) []int {
	if !a.endless {
		last = min(last, a.records)
	}
	ids := []int{}
	for id := first; id <= last; id++ {
		ids = append(ids, id)
	}
	return ids
}

// products serves page-number pagination: ?page=P&per_page=N → {page, per_page, total_pages, items}.
func (a *repAPI) products(w http.ResponseWriter, r *http.Request) {
	page, ok1 := repIntParam(w, r, "page", 1)
	perPage, ok2 := repIntParam(w, r, "per_page", 1)
	if !ok1 || !ok2 {
		return
	}
	total := (a.records + perPage - 1) / perPage
	if a.endless {
		total = page + 1
	}
	repJSON(w, map[string]any{"page": page, "per_page": perPage, "total_pages": total,
		"items": repRecords("product", a.ids((page-1)*perPage+1, page*perPage))})
}

// users serves offset pagination: ?offset=O&limit=N → {users} (fewer than N on the last page).
func (a *repAPI) users(w http.ResponseWriter, r *http.Request) {
	offset, ok1 := repIntParam(w, r, "offset", 0)
	limit, ok2 := repIntParam(w, r, "limit", 1)
	if !ok1 || !ok2 {
		return
	}
	repJSON(w, map[string]any{"users": repRecords("user", a.ids(offset+1, offset+limit))})
}

// events serves cursor pagination: ?limit=N[&cursor=C] → {events, next_cursor} (null on the last page). The
// cursor is opaque: the base64 of the last id returned.
func (a *repAPI) events(w http.ResponseWriter, r *http.Request) {
	limit, ok := repIntParam(w, r, "limit", 1)
	if !ok {
		return
	}
	after := 0
	if c := r.URL.Query().Get("cursor"); c != "" {
		id, err := repDecodeCursor(c)
		if err != nil {
			http.Error(w, "bad cursor", http.StatusBadRequest)
			return
		}
		after = id
	}
	ids := a.ids(after+1, after+limit)
	var next any
	if len(ids) > 0 && (a.endless || ids[len(ids)-1] < a.records) {
		next = repEncodeCursor(ids[len(ids)-1])
	}
	repJSON(w, map[string]any{"events": repRecords("event", ids), "next_cursor": next})
}

// repOrdersPerPage is the page size of /v1/orders, which has no size parameter.
const repOrdersPerPage = 100

// orders serves next-URL pagination: ?status=open[&page_token=T] → {orders, links: {next}}, with no next link
// on the last page. The page token is opaque. The request must ask for JSON.
func (a *repAPI) orders(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Accept") != "application/json" || r.URL.Query().Get("status") != "open" {
		http.Error(w, "want Accept: application/json and status=open", http.StatusBadRequest)
		return
	}
	after := 0
	if tok := r.URL.Query().Get("page_token"); tok != "" {
		id, err := repDecodeCursor(tok)
		if err != nil {
			http.Error(w, "bad page token", http.StatusBadRequest)
			return
		}
		after = id
	}
	ids := a.ids(after+1, after+repOrdersPerPage)
	links := map[string]string{"self": "http://" + repAPIHost + r.URL.RequestURI()}
	if len(ids) > 0 && (a.endless || ids[len(ids)-1] < a.records) {
		links["next"] = "http://" + repAPIHost + "/v1/orders?status=open&page_token=" + repEncodeCursor(ids[len(ids)-1])
	}
	repJSON(w, map[string]any{"orders": repRecords("order", ids), "links": links})
}

// export serves the export job: "running" until poll pollsUntilDone, then exportOutcome.
func (a *repAPI) export(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	a.polls++
	n := a.polls
	a.mu.Unlock()
	status := "running"
	if a.pollsUntilDone > 0 && n >= a.pollsUntilDone {
		status = a.exportOutcome
	}
	body := map[string]any{"id": 42, "status": status, "polls": n}
	if status == "done" {
		body["download_url"] = "http://" + repAPIHost + "/v1/exports/42/file"
	}
	repJSON(w, body)
}

func repRecords(kind string, ids []int) []map[string]any {
	out := make([]map[string]any, 0, len(ids))
	for _, id := range ids {
		out = append(out, map[string]any{"id": id, "name": fmt.Sprintf("%s %d", kind, id)})
	}
	return out
}

func repEncodeCursor(id int) string {
	return base64.RawURLEncoding.EncodeToString([]byte("after:" + strconv.Itoa(id)))
}

func repDecodeCursor(c string) (int, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, err
	}
	s, ok := strings.CutPrefix(string(b), "after:")
	if !ok {
		return 0, fmt.Errorf("cursor %q", c)
	}
	return strconv.Atoi(s)
}

// repIntParam reads a required integer query parameter >= least, answering 400 when it is missing or bad.
func repIntParam(w http.ResponseWriter, r *http.Request, name string, least int) (int, bool) {
	n, err := strconv.Atoi(r.URL.Query().Get(name))
	if err != nil || n < least {
		http.Error(w, fmt.Sprintf("%s: want an integer >= %d", name, least), http.StatusBadRequest)
		return 0, false
	}
	return n, true
}

func repJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
