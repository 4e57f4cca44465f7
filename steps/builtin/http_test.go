package builtin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
)

// httpBundle is an HTTP peer and a handler whose clock is pinned at now and whose body limit is 1 KiB.
type httpBundle struct {
	server  *httptest.Server
	handler *httpHandler
	now     time.Time
}

func setupHTTP(t *testing.T) *httpBundle {
	t.Helper()
	now := time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)

	mux := http.NewServeMux()
	mux.HandleFunc("/json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Add("X-Multi", "first")
		w.Header().Add("X-Multi", "second")
		_, _ = io.WriteString(w, `{"ok": true, "id": 12345678901234567890}`)
	})
	mux.HandleFunc("/problem", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		_, _ = io.WriteString(w, `{"title": "x"}`)
	})
	mux.HandleFunc("/bad-json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"truncated": `)
	})
	mux.HandleFunc("/text", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "hello")
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, strings.Repeat("x", 1025))
	})
	mux.HandleFunc("/just-fits", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, strings.Repeat("x", 1024))
	})
	status := func(code int, retryAfter string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.WriteHeader(code)
			_, _ = fmt.Fprintf(w, "status %d body", code)
		}
	}
	mux.HandleFunc("/201", status(http.StatusCreated, ""))
	mux.HandleFunc("/401", status(http.StatusUnauthorized, ""))
	mux.HandleFunc("/404", status(http.StatusNotFound, ""))
	mux.HandleFunc("/404-retry-after", status(http.StatusNotFound, "7"))
	mux.HandleFunc("/429-seconds", status(http.StatusTooManyRequests, "7"))
	mux.HandleFunc("/429-date", status(http.StatusTooManyRequests, now.Add(90*time.Second).Format(http.TimeFormat)))
	mux.HandleFunc("/503", status(http.StatusServiceUnavailable, ""))
	mux.HandleFunc("/503-past-date", status(http.StatusServiceUnavailable, now.Add(-time.Hour).Format(http.TimeFormat)))
	mux.HandleFunc("/500-bad-retry-after", status(http.StatusInternalServerError, "soon"))
	mux.HandleFunc("/hang", func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers; returns once the client gives up
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{
			"method":       r.Method,
			"content_type": r.Header.Get("Content-Type"),
			"x_test":       r.Header.Get("X-Test"),
			"host":         r.Host,
			"body":         string(body),
			"query":        r.URL.RawQuery,
		})
	})

	server := httptest.NewServer(mux)
	t.Cleanup(server.Close)
	client := server.Client()
	t.Cleanup(client.CloseIdleConnections)

	return &httpBundle{
		server:  server,
		handler: &httpHandler{client: client, now: func() time.Time { return now }, maxBody: 1024},
		now:     now,
	}
}

// input returns the handler input for a GET of path on the bundle's server, with extra fields.
func (b *httpBundle) input(path, extra string) string {
	in := fmt.Sprintf(`{"url": %q`, b.server.URL+path)
	if extra != "" {
		in += ", " + extra
	}
	return in + "}"
}

// httpResult is the output of the http handler, decoded.
type httpResult struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body"`
}

func TestHTTPSuccess(t *testing.T) {
	t.Parallel()
	b := setupHTTP(t)

	for _, tc := range []struct {
		name, path, extra string
		wantStatus        int
		wantBody          string // JSON
		wantHeaders       map[string]string
	}{
		{
			name: "JSON", path: "/json", wantStatus: 200,
			wantBody:    `{"ok": true, "id": 12345678901234567890}`,
			wantHeaders: map[string]string{"Content-Type": "application/json; charset=utf-8", "X-Multi": "first"},
		},
		{name: "PlusJSON", path: "/problem", wantStatus: 200, wantBody: `{"title": "x"}`},
		{name: "InvalidJSONIsAString", path: "/bad-json", wantStatus: 200, wantBody: `"{\"truncated\": "`},
		{
			name: "Text", path: "/text", wantStatus: 200, wantBody: `"hello"`,
			wantHeaders: map[string]string{"Content-Type": "text/plain"},
		},
		{name: "Any2xx", path: "/201", wantStatus: 201, wantBody: `"status 201 body"`},
		{name: "Expected404", path: "/404", extra: `"expect": [200, 404]`, wantStatus: 404, wantBody: `"status 404 body"`},
		{name: "Expected503", path: "/503", extra: `"expect": [503]`, wantStatus: 503, wantBody: `"status 503 body"`},
		{name: "BodyAtLimit", path: "/just-fits", wantStatus: 200, wantBody: `"` + strings.Repeat("x", 1024) + `"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := run(context.Background(), b.handler, b.input(tc.path, tc.extra), 1)
			require.NoError(t, err)
			var res httpResult
			require.NoError(t, json.Unmarshal([]byte(out), &res))
			require.Equal(t, tc.wantStatus, res.Status)
			require.JSONEq(t, tc.wantBody, string(res.Body))
			for k, v := range tc.wantHeaders {
				require.Equal(t, v, res.Headers[k], "header %s", k)
			}
		})
	}
}

func TestHTTPRequest(t *testing.T) {
	t.Parallel()
	b := setupHTTP(t)

	for _, tc := range []struct {
		name, extra string
		want        map[string]string
	}{
		{
			name: "DefaultGET",
			want: map[string]string{"method": "GET", "body": "", "content_type": ""},
		},
		{
			name: "JSONBody", extra: `"method": "post", "body": {"a": [1, 2]}`,
			want: map[string]string{"method": "POST", "body": `{"a": [1, 2]}`, "content_type": "application/json"},
		},
		{
			name: "NumberBody", extra: `"method": "PUT", "body": 42`,
			want: map[string]string{"method": "PUT", "body": `42`, "content_type": "application/json"},
		},
		{
			name: "StringBodyAsIs", extra: `"method": "POST", "body": "a=1&b=2", "headers": {"Content-Type": "application/x-www-form-urlencoded"}`,
			want: map[string]string{"body": "a=1&b=2", "content_type": "application/x-www-form-urlencoded"},
		},
		{
			name: "JSONBodyOwnContentType", extra: `"method": "POST", "body": {}, "headers": {"content-type": "application/vnd.x+json"}`,
			want: map[string]string{"body": "{}", "content_type": "application/vnd.x+json"},
		},
		{
			name: "NullBody", extra: `"method": "POST", "body": null`,
			want: map[string]string{"body": "", "content_type": ""},
		},
		{
			name: "Headers", extra: `"headers": {"X-Test": "yes", "Host": "example.test"}`,
			want: map[string]string{"x_test": "yes", "host": "example.test"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := run(context.Background(), b.handler, b.input("/echo", tc.extra), 1)
			require.NoError(t, err)
			var res struct {
				Body map[string]string `json:"body"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &res))
			for k, v := range tc.want {
				require.Equal(t, v, res.Body[k], "echoed %s", k)
			}
		})
	}
}

// The query field merges parameters into the URL's query string: a key replaces that parameter, null or an
// empty list removes it, a list repeats it, numbers are sent as written.
func TestHTTPQuery(t *testing.T) {
	t.Parallel()
	b := setupHTTP(t)

	for _, tc := range []struct {
		name, path, query string // query: the JSON of the query field, "" for none
		want              string
	}{
		{name: "NoQueryKeepsTheURLAsWritten", path: "/echo?b=2&a=1", want: "b=2&a=1"},
		{name: "EmptyQueryKeepsTheURLAsWritten", path: "/echo?b=2&a=1", query: `{}`, want: "b=2&a=1"},
		{name: "AddsToAURLWithoutQuery", path: "/echo", query: `{"page": 2}`, want: "page=2"},
		{name: "ReplacesAParameter", path: "/echo?page=1&per_page=10", query: `{"page": 3}`, want: "page=3&per_page=10"},
		{name: "ReplacesEveryValueOfAParameter", path: "/echo?tag=a&tag=b", query: `{"tag": "c"}`, want: "tag=c"},
		{name: "NumbersAsWritten", path: "/echo", query: `{"x": 1.50, "y": -3, "z": 1e3, "big": 12345678901234567890}`,
			want: "big=12345678901234567890&x=1.50&y=-3&z=1e3"},
		{name: "StringsAreEscaped", path: "/echo", query: `{"q": "a b&c=d", "ok": true, "no": false}`,
			want: "no=false&ok=true&q=a+b%26c%3Dd"},
		{name: "ListRepeatsInOrder", path: "/echo", query: `{"tag": ["z", 2, false, "a"]}`, want: "tag=z&tag=2&tag=false&tag=a"},
		{name: "NullRemoves", path: "/echo?cursor=abc&limit=5", query: `{"cursor": null}`, want: "limit=5"},
		{name: "EmptyListRemoves", path: "/echo?cursor=abc&limit=5", query: `{"cursor": []}`, want: "limit=5"},
		{name: "NullOfAnAbsentParameter", path: "/echo", query: `{"cursor": null, "limit": 5}`, want: "limit=5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			extra := ""
			if tc.query != "" {
				extra = `"query": ` + tc.query
			}
			out, err := run(context.Background(), b.handler, b.input(tc.path, extra), 1)
			require.NoError(t, err)
			var res struct {
				Body map[string]string `json:"body"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &res))
			require.Equal(t, tc.want, res.Body["query"])
		})
	}
}

// A successful response's status reaches the outcome rules through steps.OutputWithHTTPStatus.
func TestHTTPOutputReportsItsStatus(t *testing.T) {
	t.Parallel()
	b := setupHTTP(t)

	for _, tc := range []struct {
		path, extra string
		want        int
	}{
		{"/json", "", 200},
		{"/201", "", 201},
		{"/404", `"expect": [404]`, 404},
	} {
		t.Run(tc.path, func(t *testing.T) {
			t.Parallel()
			step := &steps.Step{Name: "s", Attempt: 1, Input: json.RawMessage(b.input(tc.path, tc.extra))}
			out, err := b.handler.Handle(context.Background(), step)
			require.NoError(t, err)
			s, ok := out.(steps.OutputWithHTTPStatus)
			require.True(t, ok, "the http output (%T) does not report its status", out)
			require.Equal(t, tc.want, s.HTTPStatus())
		})
	}
}

func TestHTTPClassification(t *testing.T) {
	t.Parallel()
	b := setupHTTP(t)

	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	noDelay := time.Duration(-1)
	for _, tc := range []struct {
		name           string
		input          string
		ctxTimeout     time.Duration
		wantClass      string
		wantStatus     int // 0: no HTTP status
		wantRetryAfter time.Duration
		wantMsg        string
	}{
		{name: "404", input: b.input("/404", ""), wantClass: steps.ClassPermanent, wantStatus: 404, wantRetryAfter: noDelay, wantMsg: "404 Not Found: status 404 body"},
		{name: "401", input: b.input("/401", ""), wantClass: steps.ClassPermanent, wantStatus: 401, wantRetryAfter: noDelay},
		{name: "2xxNotExpected", input: b.input("/201", `"expect": [200]`), wantClass: steps.ClassPermanent, wantStatus: 201, wantRetryAfter: noDelay},
		{name: "429RetryAfterSeconds", input: b.input("/429-seconds", ""), wantClass: steps.ClassTransient, wantStatus: 429, wantRetryAfter: 7 * time.Second},
		{name: "429RetryAfterDate", input: b.input("/429-date", ""), wantClass: steps.ClassTransient, wantStatus: 429, wantRetryAfter: 90 * time.Second},
		{name: "503", input: b.input("/503", ""), wantClass: steps.ClassTransient, wantStatus: 503, wantRetryAfter: noDelay},
		{name: "503RetryAfterPastDate", input: b.input("/503-past-date", ""), wantClass: steps.ClassTransient, wantStatus: 503, wantRetryAfter: 0},
		{name: "500RetryAfterUnparsable", input: b.input("/500-bad-retry-after", ""), wantClass: steps.ClassTransient, wantStatus: 500, wantRetryAfter: noDelay},
		{name: "404RetryAfterIgnored", input: b.input("/404-retry-after", ""), wantClass: steps.ClassPermanent, wantStatus: 404, wantRetryAfter: noDelay},
		{name: "BodyTooLarge", input: b.input("/big", ""), wantClass: steps.ClassPermanent, wantStatus: 200, wantRetryAfter: noDelay, wantMsg: "exceeds 1024 bytes"},
		{name: "NeverAnswers", input: b.input("/hang", ""), ctxTimeout: 50 * time.Millisecond, wantClass: steps.ClassTimeout, wantRetryAfter: noDelay, wantMsg: "context deadline exceeded"},
		{name: "ClosedServer", input: fmt.Sprintf(`{"url": %q}`, closedURL), wantClass: steps.ClassTransient, wantRetryAfter: noDelay, wantMsg: "GET " + closedURL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			if tc.ctxTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctxTimeout)
				defer cancel()
			}
			_, err := run(ctx, b.handler, tc.input, 1)
			fail := requireClass(t, err, tc.wantClass)
			require.Equal(t, tc.wantStatus, fail.HTTPStatus)
			if tc.wantStatus != 0 {
				require.Equal(t, fmt.Sprint(tc.wantStatus), fail.Code)
			} else {
				require.Empty(t, fail.Code)
			}
			if tc.wantRetryAfter == noDelay {
				require.Nil(t, fail.RetryAfter)
			} else {
				require.NotNil(t, fail.RetryAfter)
				require.Equal(t, tc.wantRetryAfter, *fail.RetryAfter)
			}
			require.ErrorContains(t, err, tc.wantMsg)
		})
	}
}

func TestHTTPClientTimeoutIsTimeout(t *testing.T) {
	t.Parallel()
	b := setupHTTP(t)
	client := b.server.Client()
	client.Timeout = 50 * time.Millisecond
	h := &httpHandler{client: client, now: time.Now, maxBody: MaxHTTPBodyBytes}

	_, err := run(context.Background(), h, b.input("/hang", ""), 1)
	requireClass(t, err, steps.ClassTimeout)
}

func TestHTTPCancelled(t *testing.T) {
	t.Parallel()
	b := setupHTTP(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	_, err := run(ctx, b.handler, b.input("/json", ""), 1)
	require.ErrorIs(t, err, context.Canceled)
	_, classified := steps.AsError(err)
	require.False(t, classified, "a cancelled attempt is the context's error, for the daemon to hand back")
}

func TestHTTPBadInput(t *testing.T) {
	t.Parallel()
	b := setupHTTP(t)

	for _, tc := range []struct {
		name, input, field string
	}{
		{"MissingURL", `{"method": "GET"}`, "url"},
		{"Empty", ``, "url"},
		{"RelativeURL", `{"url": "/path"}`, "url"},
		{"NoHost", `{"url": "http://"}`, "url"},
		{"FTP", `{"url": "ftp://example.com/x"}`, "url"},
		{"UnparsableURL", `{"url": "http://[::1"}`, "url"},
		{"BadMethod", b.input("/json", `"method": "GE T"`), "method"},
		{"BadHeaderName", b.input("/json", `"headers": {"Bad Header": "x"}`), "headers"},
		{"BadHeaderValue", b.input("/json", `"headers": {"X-A": "a\r\nX-B: b"}`), "headers"},
		{"BadExpect", b.input("/json", `"expect": [42]`), "expect"},
		{"QueryObject", b.input("/json", `"query": {"filter": {"a": 1}}`), "query"},
		{"QueryNestedList", b.input("/json", `"query": {"tag": [["a"]]}`), "query"},
		{"QueryNullInList", b.input("/json", `"query": {"tag": ["a", null]}`), "query"},
		{"QueryObjectInList", b.input("/json", `"query": {"tag": [{}]}`), "query"},
		{"QueryEmptyName", b.input("/json", `"query": {"": 1}`), "query"},
		{"QueryOnABadURLQuery", b.input("/json?a=%zz", `"query": {"b": 1}`), "url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := run(context.Background(), b.handler, tc.input, 1)
			requireBadInput(t, err, tc.field)
		})
	}

	for _, tc := range []struct {
		name, input, wantMsg string
	}{
		{"UnknownField", b.input("/json", `"uri": "x"`), `unknown field "uri"`},
		{"WrongType", `{"url": 5}`, "url"},
		{"HeadersNotStrings", b.input("/json", `"headers": {"X-A": 1}`), "headers"},
		{"QueryNotAnObject", b.input("/json", `"query": "page=2"`), "query"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := run(context.Background(), b.handler, tc.input, 1)
			requireClass(t, err, steps.ClassPermanent)
			require.ErrorContains(t, err, "bad input")
			require.ErrorContains(t, err, tc.wantMsg)
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)

	for _, tc := range []struct {
		value  string
		want   time.Duration
		wantOK bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"120", 2 * time.Minute, true},
		{" 5 ", 5 * time.Second, true},
		{"99999999999999999999999", time.Duration(maxRetryAfterSeconds) * time.Second, true},
		{"-5", 0, false},
		{"+5", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second, true},
		{"Monday, 06-May-30 07:09:09 GMT", time.Minute, true}, // RFC 850
		{now.Add(-time.Second).Format(http.TimeFormat), 0, true},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Parallel()
			got, ok := parseRetryAfter(tc.value, now)
			require.Equal(t, tc.wantOK, ok)
			require.Equal(t, tc.want, got)
		})
	}
}
