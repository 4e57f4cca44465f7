package worker

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestStorableJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
		err            string // strict mode's error; the lossy mode then gives lossyWant
		lossyWant      string
	}{
		{"plain", `{"a": [1, "x", {"b": null}]}`, `{"a": [1, "x", {"b": null}]}`, "", ""},
		{"escapes kept", `{"a": "\n\t\"\\ \u00e9 \ud83d\ude00"}`, `{"a": "\n\t\"\\ \u00e9 \ud83d\ude00"}`, "", ""},
		{"an escaped backslash before u0000 is text", `{"a": "\\u0000"}`, `{"a": "\\u0000"}`, "", ""},
		{"invalid UTF-8", "{\"a\": \"x\xffy\xc3\"}", "{\"a\": \"x\uFFFDy\uFFFD\"}", "", ""},
		{"invalid UTF-8 in a key", "{\"\xfe\": 1}", "{\"\uFFFD\": 1}", "", ""},
		{"lone high surrogate", `["\ud800"]`, `["\ufffd"]`, "", ""},
		{"high surrogate then a letter", `["\ud800\u0041"]`, `["\ufffd\u0041"]`, "", ""},
		{"lone low surrogate", `["a\udc00b"]`, `["a\ufffdb"]`, "", ""},
		{"two high surrogates", `["\ud800\ud800\udc00"]`, `["\ufffd\ud800\udc00"]`, "", ""},
		{"NUL", `{"a": {"b": ["x", "y\u0000"]}}`, "", "$.a.b[1]: a string holds the NUL character",
			`{"a": {"b": ["x", "y\ufffd"]}}`},
		{"NUL in a key", `{"a": {"k\u0000": 1}}`, "", "$.a (a member name): a string holds the NUL",
			`{"a": {"k\ufffd": 1}}`},
		{"NUL under an odd key", `{"a b": "\u0000"}`, "", `$["a b"]: a string holds the NUL`, `{"a b": "\ufffd"}`},
		{"NUL at the top", `"\u0000"`, "", "$: a string holds the NUL", `"\ufffd"`},
		{"NUL after keys and arrays", `{"x": [1, 2, {"y": 3}], "z": [[], ["\u0000"]]}`, "", "$.z[1][0]: ",
			`{"x": [1, 2, {"y": 3}], "z": [[], ["\ufffd"]]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := storableJSON([]byte(tt.in), false)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				lossy, err := storableJSON([]byte(tt.in), true)
				require.NoError(t, err)
				require.Equal(t, tt.lossyWant, string(lossy))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}
}

// FuzzStorableJSON: for any valid JSON document, the result is valid JSON and valid UTF-8; decoded, it holds no
// NUL (lossy) or the document was refused (strict); it is its own result again; and a document with nothing to
// replace comes back unchanged.
func FuzzStorableJSON(f *testing.F) {
	for _, s := range []string{`{}`, `"\u0000"`, "\"\xff\"", `["\ud800", "\udc00\ud800\udc00"]`, `{"a\u0000": [1]}`,
		`{"a": {"b": [1, "\\u0000", "\u00e9"]}}`, `1e1000000`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) {
			return
		}
		for _, lossy := range []bool{false, true} {
			out, err := storableJSON(doc, lossy)
			if err != nil {
				require.False(t, lossy, "the lossy mode never refuses")
				require.Contains(t, err.Error(), "NUL")
				continue
			}
			require.True(t, json.Valid(out), "%q -> %q", doc, out)
			require.True(t, utf8.Valid(out), "%q -> %q", doc, out)
			var v any
			dec := json.NewDecoder(bytes.NewReader(out))
			dec.UseNumber()
			require.NoError(t, dec.Decode(&v))
			requireNoNUL(t, v)
			again, err := storableJSON(out, lossy)
			require.NoError(t, err)
			require.Equal(t, string(out), string(again), "a storable document is left as it is")
			if utf8.Valid(doc) && !strings.Contains(string(doc), `\u`) {
				require.Equal(t, string(doc), string(out))
			}
		}
	})
}

func requireNoNUL(t *testing.T, v any) {
	t.Helper()
	switch v := v.(type) {
	case string:
		require.NotContains(t, v, "\x00")
	case []any:
		for _, e := range v {
			requireNoNUL(t, e)
		}
	case map[string]any:
		for k, e := range v {
			require.NotContains(t, k, "\x00")
			requireNoNUL(t, e)
		}
	}
}
