package docs

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// What a page shows as output and what the command prints are compared line by line after normalising both:
// white space runs (table alignment) become one space, and the values that differ from run to run become
// placeholders. A line of the page that is only "…" (or "...") stands for any number of lines.
var (
	// RFC 3339 or SQL timestamps: 2030-01-01T02:00:00Z, 2026-11-25 02:30:00.123 CET.
	timestampRe = regexp.MustCompile(`\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d(:?\d\d)?)?`)
	// Clock times: 04:53:27, 12:00:01.126.
	clockRe = regexp.MustCompile(`\b\d\d:\d\d:\d\d(\.\d+)?\b`)
	// Durations as Go and the SQL functions print them: 4.0s, 59m00s, 1m05s, 850ms, 2h03m, 3d4h.
	durationRe = regexp.MustCompile(`\b(\d+(\.\d+)?(ns|µs|us|ms|s|m|h|d))+\b`)
)

// normaliseLine returns line with its white space collapsed, timestamps, clock times and durations replaced by
// <ts>, <time> and <dur>, and every integer that stands alone (an id, a count: "task 5", "[12]", `"task_id": 7`,
// not "1/3", "v2", "tenant:9" or "2030-01-01") replaced by <n>.
func normaliseLine(line string) string {
	line = strings.Join(strings.Fields(line), " ")
	line = timestampRe.ReplaceAllString(line, "<ts>")
	line = clockRe.ReplaceAllString(line, "<time>")
	line = durationRe.ReplaceAllString(line, "<dur>")
	return standaloneInts(line)
}

// standaloneInts replaces each run of digits whose neighbours are neither letters, digits nor one of ./:-_ by
// <n> (a JSON number after its key's colon included).
func standaloneInts(s string) string {
	r := []rune(s)
	var b strings.Builder
	joins := func(c rune) bool {
		return unicode.IsLetter(c) || unicode.IsDigit(c) || strings.ContainsRune("./:-_", c)
	}
	for i := 0; i < len(r); {
		if !unicode.IsDigit(r[i]) {
			b.WriteRune(r[i])
			i++
			continue
		}
		j := i
		for j < len(r) && unicode.IsDigit(r[j]) {
			j++
		}
		// A JSON number after its key ("task_id":7) stands alone; a key's suffix (tenant:9) does not.
		jsonValue := i >= 2 && r[i-1] == ':' && r[i-2] == '"'
		if (i == 0 || !joins(r[i-1]) || jsonValue) && (j == len(r) || !joins(r[j])) {
			b.WriteString("<n>")
		} else {
			b.WriteString(string(r[i:j]))
		}
		i = j
	}
	return b.String()
}

// outputLines returns text's lines, normalised, without leading and trailing blank lines.
func outputLines(text string) []string {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, normaliseLine(l))
	}
	for len(out) > 0 && out[0] == "" {
		out = out[1:]
	}
	for len(out) > 0 && out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	return out
}

// isGap reports whether a normalised line of a page's output stands for any number of lines.
func isGap(line string) bool { return line == "…" || line == "..." }

// matchOutput reports whether got (what the commands printed) matches want (the page's output block), and
// otherwise explains the first difference.
func matchOutput(want, got string) (bool, string) {
	w, g := outputLines(want), outputLines(got)
	if matchLines(w, g) {
		return true, ""
	}
	// The longest prefix that matches, to point at the line that does not.
	i := 0
	for i < len(w) && !isGap(w[i]) && i < len(g) && w[i] == g[i] {
		i++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "the output differs from the page (compared after normalising ids and times)")
	if i < len(w) {
		fmt.Fprintf(&b, ", first at the page's line %d:\n  page:   %q\n", i+1, w[i])
		if i < len(g) {
			fmt.Fprintf(&b, "  output: %q\n", g[i])
		} else {
			fmt.Fprintf(&b, "  output: (no more lines)\n")
		}
	} else {
		fmt.Fprintf(&b, ": the output has more lines than the page, from %q\n", g[min(i, len(g)-1)])
	}
	fmt.Fprintf(&b, "page (normalised):\n  %s\noutput (normalised):\n  %s", strings.Join(w, "\n  "),
		strings.Join(g, "\n  "))
	return false, b.String()
}

// matchLines matches normalised lines, a gap line of want standing for any number of lines of got.
func matchLines(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if isGap(want[0]) {
		for k := 0; k <= len(got); k++ {
			if matchLines(want[1:], got[k:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && want[0] == got[0] && matchLines(want[1:], got[1:])
}
