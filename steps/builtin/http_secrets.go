package builtin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/stepready/stepready/steps"
)

// sensitiveHeaders are the request headers whose values are never shown (docs/security.md): redacted from errors and
// from what the response echoes back, whether given literally or as {"env": "NAME"}.
var sensitiveHeaders = []string{"Authorization", "Cookie", "Proxy-Authorization", "X-Api-Key"}

// redactedText replaces a secret wherever it would be shown.
const redactedText = "[REDACTED]"

// minSecretLength is the shortest value redacted: shorter ones would match ordinary text.
const minSecretLength = 4

// headerValue is the value of a header in the http handler's input: a string, or {"env": "NAME"}, resolved from
// the daemon's environment when the attempt runs and never stored (the step's input holds only the name).
type headerValue struct {
	literal string
	env     string
}

// UnmarshalJSON accepts a JSON string or an object {"env": "NAME"}.
func (v *headerValue) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &v.literal)
	}
	var ref struct {
		Env *string `json:"env"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ref); err != nil || ref.Env == nil || *ref.Env == "" {
		return errors.New(`headers: a value is a string or {"env": "NAME"}`)
	}
	v.env = *ref.Env
	return nil
}

// resolve returns the value to send, reading the environment for an {"env": …} value.
func (v headerValue) resolve() (value string, fromEnv bool, err error) {
	if v.env == "" {
		return v.literal, false, nil
	}
	value, ok := os.LookupEnv(v.env)
	if !ok {
		return "", true, fmt.Errorf("environment variable %s is not set in the scheduler's environment", v.env)
	}
	return value, true, nil
}

// secrets returns the values of req that must not be shown: the sensitive headers' and every value taken from
// the environment (names in fromEnv), and for a value "Scheme token" the token alone too.
func secrets(req *http.Request, fromEnv []string) []string {
	var out []string
	add := func(v string) {
		if len(v) >= minSecretLength {
			out = append(out, v)
		}
		if _, token, ok := strings.Cut(v, " "); ok && len(token) >= minSecretLength {
			out = append(out, token)
		}
	}
	for _, name := range append(append([]string{}, sensitiveHeaders...), fromEnv...) {
		for _, v := range req.Header.Values(name) {
			add(v)
		}
	}
	return out
}

// redact replaces every secret in s.
func redact(s string, secrets []string) string {
	for _, v := range secrets {
		s = strings.ReplaceAll(s, v, redactedText)
	}
	return s
}

// redactError returns err with every secret removed from its message, keeping its failure class.
func redactError(err error, secrets []string) error {
	if err == nil || len(secrets) == 0 || redact(err.Error(), secrets) == err.Error() {
		return err
	}
	var fail *steps.Error
	if errors.As(err, &fail) {
		cp := *fail
		if cp.Err != nil {
			cp.Err = errors.New(redact(cp.Err.Error(), secrets))
		}
		return &cp
	}
	return errors.New(redact(err.Error(), secrets))
}
