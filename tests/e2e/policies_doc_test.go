package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// polRepoRoot is the repository root, seen from this package's directory.
const polRepoRoot = "../.."

// polDoc is the page whose examples must match examples/policies byte for byte.
const polDoc = "docs/policies.md"

// polMarker is the line that introduces an embedded example: `<!-- example: PATH -->`, PATH relative to the
// repository root. The next line opens a ```yaml block whose content must be the file.
var polMarker = regexp.MustCompile(`^<!-- example: (\S+) -->$`)

// polDocExample is one example embedded in the doc.
type polDocExample struct {
	path string // as written in the marker
	line int    // 1-based line of the marker
	body []byte // the content of the code block, every line with its "\n"
}

// polParseDocExamples returns the examples embedded in doc, in order. A marker not followed by a ```yaml block,
// or a block that is never closed, is an error naming the line.
func polParseDocExamples(doc []byte) ([]polDocExample, error) {
	lines := bytes.SplitAfter(doc, []byte("\n"))
	var out []polDocExample
	for i := 0; i < len(lines); i++ {
		m := polMarker.FindSubmatch(bytes.TrimRight(lines[i], "\n"))
		if m == nil {
			continue
		}
		ex := polDocExample{path: string(m[1]), line: i + 1}
		if i+1 >= len(lines) || string(lines[i+1]) != "```yaml\n" {
			return nil, fmt.Errorf("line %d: the marker for %s must be followed by a line \"```yaml\"", ex.line, ex.path)
		}
		end := -1
		for j := i + 2; j < len(lines); j++ {
			if string(bytes.TrimRight(lines[j], "\n")) == "```" {
				end = j
				break
			}
		}
		if end < 0 {
			return nil, fmt.Errorf("line %d: the ```yaml block of %s is never closed", ex.line, ex.path)
		}
		ex.body = bytes.Join(lines[i+2:end], nil)
		out = append(out, ex)
		i = end
	}
	return out, nil
}

// The examples of docs/policies.md are the files of examples/policies, byte for byte, and every file of
// examples/policies is in the doc, once: the page cannot drift from what TestPolicy* run.
func TestPoliciesDocMatchesExamples(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join(polRepoRoot, polDoc))
	require.NoError(t, err)
	examples, err := polParseDocExamples(doc)
	require.NoError(t, err)
	require.NotEmpty(t, examples, "%s embeds no example", polDoc)

	var embedded []string
	for _, ex := range examples {
		require.NotContains(t, embedded, ex.path, "%s:%d: %s is embedded twice", polDoc, ex.line, ex.path)
		embedded = append(embedded, ex.path)
		want, err := os.ReadFile(filepath.Join(polRepoRoot, filepath.FromSlash(ex.path)))
		require.NoError(t, err, "%s:%d: the marker names a file that cannot be read", polDoc, ex.line)
		require.Equal(t, string(want), string(ex.body),
			"%s:%d: the block differs from %s (copy the file into the doc verbatim)", polDoc, ex.line, ex.path)
	}

	entries, err := os.ReadDir(filepath.Join(polRepoRoot, "examples", "policies"))
	require.NoError(t, err)
	var missing []string
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		if p := "examples/policies/" + e.Name(); !slices.Contains(embedded, p) {
			missing = append(missing, p)
		}
	}
	require.Empty(t, missing, "files of examples/policies not embedded in %s (add `<!-- example: PATH -->` and a ```yaml block)", polDoc)

	// The class the breaker test adds is the one the page tells operators to add.
	require.Contains(t, string(doc), "```sql\n"+polQuotaClassSQL+"\n```\n", "%s shows polQuotaClassSQL", polDoc)
}

// The parser itself: a test that cannot fail would prove nothing.
func TestPoliciesDocParser(t *testing.T) {
	t.Parallel()
	good := "intro\n<!-- example: examples/policies/a.yaml -->\n```yaml\nname: a\n\nsteps: []\n```\ntext\n" +
		"<!-- example: b.yaml -->\n```yaml\n```\n"
	got, err := polParseDocExamples([]byte(good))
	require.NoError(t, err)
	require.Equal(t, []polDocExample{
		{path: "examples/policies/a.yaml", line: 2, body: []byte("name: a\n\nsteps: []\n")},
		{path: "b.yaml", line: 9, body: []byte{}},
	}, got)

	for name, bad := range map[string]string{
		"no block":       "<!-- example: a.yaml -->\ntext\n",
		"wrong language": "<!-- example: a.yaml -->\n```json\n{}\n```\n",
		"blank line":     "<!-- example: a.yaml -->\n\n```yaml\nx: 1\n```\n",
		"unclosed":       "<!-- example: a.yaml -->\n```yaml\nx: 1\n",
		"at the end":     "<!-- example: a.yaml -->",
	} {
		_, err := polParseDocExamples([]byte(bad))
		require.Error(t, err, name)
		require.ErrorContains(t, err, "line 1", name)
	}
	// A mention inside a sentence is not a marker.
	got, err = polParseDocExamples([]byte("see `<!-- example: PATH -->` markers\n"))
	require.NoError(t, err)
	require.Empty(t, got)
}
