package builtin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stepready/stepready/steps"
)

// MaxHTTPBodyBytes is the largest response body the `http` handler reads into a step's output (10 MiB). A
// larger body fails the attempt permanently: the output is stored in the database, and silently truncating it
// would hand dependent steps data that looks complete but is not.
const MaxHTTPBodyBytes = 10 << 20

// httpErrorBodyBytes is how much of an unexpected response's body goes into the error message.
const httpErrorBodyBytes = 512

// httpInput is the input of the `http` handler.
type httpInput struct {
	// Method is the request method; default GET, case-insensitive.
	Method string `json:"method"`
	// URL is the absolute http or https URL to call. Required.
	URL string `json:"url"`
	// Query holds query parameters merged into URL's query string, so that a repeating step (pagination) can
	// change one parameter in its next input without rebuilding the URL. Each key replaces every value of that
	// parameter in URL. A value is a string, a number (sent as written in the JSON), a boolean, a list of those
	// (the parameter repeated, in order) or null (the parameter is removed). Empty or absent leaves URL as is;
	// otherwise the resulting query string is re-encoded with its parameters sorted by name.
	Query map[string]json.RawMessage `json:"query"`
	// Headers are request headers, one value each: a string, or {"env": "NAME"} for a secret read from the
	// daemon's environment when the attempt runs (never stored). The values of Authorization, Cookie,
	// Proxy-Authorization and X-Api-Key, and every value from the environment, are redacted from errors and from
	// the response recorded as output.
	Headers map[string]headerValue `json:"headers"`
	// Body is the request body: a JSON string is sent as is, any other JSON value is sent JSON-encoded with
	// Content-Type application/json (unless Headers set one); absent or null sends no body.
	Body json.RawMessage `json:"body"`
	// Expect lists the statuses that complete the step; empty means any 2xx.
	Expect []int `json:"expect"`

	// fromEnv lists the headers whose values came from the environment (set by newRequest).
	fromEnv []string
}

// httpOutput is the output of the `http` handler.
type httpOutput struct {
	// Status is the response status code.
	Status int `json:"status"`
	// Headers holds the first value of each response header, keys in canonical form (Content-Type).
	Headers map[string]string `json:"headers"`
	// Body is the response body: the JSON value itself when the response is JSON (application/json or
	// …+json) and parses, else a string.
	Body any `json:"body"`
}

// HTTPStatus implements steps.OutputWithHTTPStatus: the outcome rules of a successful attempt see the
// response's status as `outcome.http.status`.
func (o httpOutput) HTTPStatus() int { return o.Status }

// httpHandler is the `http` handler.
type httpHandler struct {
	client *http.Client
	// now is the clock for Retry-After dates; time.Now outside tests.
	now func() time.Time
	// maxBody is the largest response body accepted, in bytes; MaxHTTPBodyBytes outside tests.
	maxBody int64
}

// newHTTPHandler returns the `http` handler sending its requests with client.
func newHTTPHandler(client *http.Client) *httpHandler {
	return &httpHandler{client: client, now: time.Now, maxBody: MaxHTTPBodyBytes}
}

// Handle implements steps.Handler.
func (h *httpHandler) Handle(ctx context.Context, step *steps.Step) (any, error) {
	in, req, err := h.decodeRequest(ctx, step)
	if err != nil {
		return nil, err
	}
	hidden := secrets(req, in.fromEnv)
	out, err := h.do(ctx, in, req)
	if err != nil {
		return nil, redactError(err, hidden)
	}
	if len(hidden) > 0 {
		// What the server echoes back is recorded as the step's output: no secret goes with it.
		for k, v := range out.Headers {
			out.Headers[k] = redact(v, hidden)
		}
		if b, err := json.Marshal(out.Body); err == nil {
			if r := redact(string(b), hidden); r != string(b) && json.Valid([]byte(r)) {
				out.Body = json.RawMessage(r)
			}
		}
	}
	return out, nil
}

// do sends the request and reads the response.
func (h *httpHandler) do(ctx context.Context, in httpInput, req *http.Request) (httpOutput, error) {
	target := req.Method + " " + req.URL.Redacted()

	resp, err := h.client.Do(req)
	if err != nil {
		return httpOutput{}, classifyHTTPError(ctx, target, err)
	}
	defer resp.Body.Close()

	if !expectedStatus(resp.StatusCode, in.Expect) {
		return httpOutput{}, h.statusError(target, resp)
	}

	body, err := io.ReadAll(io.LimitReader(resp.Body, h.maxBody+1))
	if err != nil {
		return httpOutput{}, classifyHTTPError(ctx, target, fmt.Errorf("read response body: %w", err))
	}
	if int64(len(body)) > h.maxBody {
		return httpOutput{}, &steps.Error{
			Class:      steps.ClassPermanent,
			HTTPStatus: resp.StatusCode,
			Code:       strconv.Itoa(resp.StatusCode),
			Err:        fmt.Errorf("http handler: %s: response body exceeds %d bytes", target, h.maxBody),
		}
	}

	headers := make(map[string]string, len(resp.Header))
	for k, v := range resp.Header {
		if len(v) > 0 {
			headers[k] = v[0]
		}
	}
	return httpOutput{Status: resp.StatusCode, Headers: headers, Body: responseBody(resp.Header, body)}, nil
}

// decodeRequest decodes the step's input and builds the request it describes, sending nothing; a bad input is a
// permanent error naming the field.
func (h *httpHandler) decodeRequest(ctx context.Context, step *steps.Step) (httpInput, *http.Request, error) {
	var in httpInput
	if err := decodeInput(step, &in); err != nil {
		return in, nil, err
	}
	req, err := h.newRequest(ctx, step, &in)
	return in, req, err
}

// newRequest validates the input and builds the request; every failure is a permanent error naming the field.
func (h *httpHandler) newRequest(ctx context.Context, step *steps.Step, in *httpInput) (*http.Request, error) {
	method := strings.ToUpper(in.Method)
	if method == "" {
		method = http.MethodGet
	}
	if !isToken(method) {
		return nil, badInput(step, "method", "%q is not an HTTP method", in.Method)
	}

	if in.URL == "" {
		return nil, badInput(step, "url", "required")
	}
	u, err := url.Parse(in.URL)
	if err != nil {
		return nil, badInput(step, "url", "%v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, badInput(step, "url", "scheme must be http or https, got %q", u.Scheme)
	}
	if u.Host == "" {
		return nil, badInput(step, "url", "no host in %q", u.Redacted())
	}
	if err := mergeQuery(step, u, in.Query); err != nil {
		return nil, err
	}

	for _, status := range in.Expect {
		if status < 100 || status > 599 {
			return nil, badInput(step, "expect", "%d is not an HTTP status (100..599)", status)
		}
	}

	var body io.Reader
	jsonBody := false
	switch trimmed := bytes.TrimSpace(in.Body); {
	case len(trimmed) == 0 || string(trimmed) == "null":
	case trimmed[0] == '"':
		var s string
		if err := json.Unmarshal(trimmed, &s); err != nil {
			return nil, badInput(step, "body", "%v", err)
		}
		body = strings.NewReader(s)
	default:
		body = bytes.NewReader(trimmed)
		jsonBody = true
	}

	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, badInput(step, "url", "%v", err)
	}
	for k, hv := range in.Headers {
		if !isToken(k) {
			return nil, badInput(step, "headers", "%q is not a valid header name", k)
		}
		v, fromEnv, err := hv.resolve()
		if err != nil {
			return nil, badInput(step, "headers", "%q: %v", k, err)
		}
		if fromEnv {
			in.fromEnv = append(in.fromEnv, k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return nil, badInput(step, "headers", "the value of %q contains CR, LF or NUL", k)
		}
		if http.CanonicalHeaderKey(k) == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	if jsonBody && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// mergeQuery sets the parameters of query (httpInput.Query) in u's query string. A bad value is a permanent
// error naming the parameter.
func mergeQuery(step *steps.Step, u *url.URL, query map[string]json.RawMessage) error {
	if len(query) == 0 {
		return nil
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return badInput(step, "url", "query string: %v", err)
	}
	for _, name := range slices.Sorted(maps.Keys(query)) {
		if name == "" {
			return badInput(step, "query", "a parameter name is empty")
		}
		values, err := queryValues(query[name])
		if err != nil {
			return badInput(step, "query", "parameter %q: %v", name, err)
		}
		if len(values) == 0 {
			q.Del(name)
		} else {
			q[name] = values
		}
	}
	u.RawQuery = q.Encode()
	return nil
}

// queryValues returns the values one query parameter takes from its JSON value: a scalar gives one value, a
// list one per element, null none.
func queryValues(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] != '[' {
		v, err := queryScalar(raw)
		if err != nil {
			return nil, err
		}
		return []string{v}, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, err
	}
	values := make([]string, 0, len(list))
	for i, e := range list {
		v, err := queryScalar(bytes.TrimSpace(e))
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		values = append(values, v)
	}
	return values, nil
}

// queryScalar returns the text of one query value: a string as is, a number as written, a boolean as true or
// false. raw is valid JSON (it was decoded as part of the input) with no surrounding space.
func queryScalar(raw json.RawMessage) (string, error) {
	switch {
	case len(raw) == 0:
		return "", errors.New("empty value")
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	case string(raw) == "true" || string(raw) == "false":
		return string(raw), nil
	case raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9':
		return string(raw), nil
	case raw[0] == '{':
		return "", errors.New("an object is not a query value (use a string, number, boolean, list or null)")
	case raw[0] == '[':
		return "", errors.New("a list inside a list is not a query value")
	case string(raw) == "null":
		return "", errors.New("null inside a list is not a query value")
	}
	return "", fmt.Errorf("%s is not a query value", raw)
}

// statusError classifies a response whose status is not expected: 429 and 5xx are transient and honour
// Retry-After, other statuses are permanent.
func (h *httpHandler) statusError(target string, resp *http.Response) error {
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, httpErrorBodyBytes))
	msg := fmt.Sprintf("http handler: %s: unexpected status %s", target, resp.Status)
	if s := strings.TrimSpace(strings.ToValidUTF8(string(snippet), "\uFFFD")); s != "" {
		msg += ": " + s
	}
	fail := &steps.Error{
		Class:      steps.ClassPermanent,
		Code:       strconv.Itoa(resp.StatusCode),
		HTTPStatus: resp.StatusCode,
		Err:        errors.New(msg),
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		fail.Class = steps.ClassTransient
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), h.now()); ok {
			fail.RetryAfter = &d
		}
	}
	return fail
}

// classifyHTTPError classifies a failure to send the request or read the response: the step's deadline, or
// any other timeout, is `timeout`; a cancelled context is returned wrapped (the daemon is shutting down); any
// other error is a network error, `transient`.
func classifyHTTPError(ctx context.Context, target string, err error) error {
	err = fmt.Errorf("http handler: %s: %w", target, err)
	if _, ok := deniedAddress(err); ok {
		// The guard refused the destination (docs/security.md): retrying cannot change that.
		return steps.Fail(steps.ClassPermanent, err)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			return steps.Fail(steps.ClassTimeout, err)
		}
		return err
	}
	if netErr, ok := errors.AsType[net.Error](err); ok && netErr.Timeout() {
		return steps.Fail(steps.ClassTimeout, err)
	}
	return steps.Fail(steps.ClassTransient, err)
}

// expectedStatus reports whether status completes the step: it is listed in expect, or expect is empty and
// status is 2xx.
func expectedStatus(status int, expect []int) bool {
	if len(expect) == 0 {
		return status >= 200 && status <= 299
	}
	return slices.Contains(expect, status)
}

// responseBody returns the body for the output: the JSON value when the response says it is JSON and it
// parses, else the body as a string.
func responseBody(header http.Header, body []byte) any {
	if isJSONMediaType(header.Get("Content-Type")) && json.Valid(body) {
		return json.RawMessage(body)
	}
	return capturedText(body)
}

// isJSONMediaType reports whether a Content-Type is application/json or a +json type.
func isJSONMediaType(contentType string) bool {
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}

// maxRetryAfterSeconds is the longest Retry-After delay representable as a time.Duration.
const maxRetryAfterSeconds = math.MaxInt64 / int64(time.Second)

// parseRetryAfter parses a Retry-After header value: delay-seconds (digits only) or an HTTP-date, relative to
// now; a date in the past means 0. ok is false for an absent or malformed value, which leaves the delay to
// the step's backoff.
func parseRetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if strings.Trim(value, "0123456789") == "" {
		secs, err := strconv.ParseInt(value, 10, 64)
		if err != nil || secs > maxRetryAfterSeconds { // err: out of int64 range
			secs = maxRetryAfterSeconds
		}
		return time.Duration(secs) * time.Second, true
	}
	when, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	return max(when.Sub(now), 0), true
}

// isToken reports whether s is a non-empty RFC 9110 token (a method or a header name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}
