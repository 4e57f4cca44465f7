package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
)

// Terminal output of client-supplied text. Task and step names, namespaces, error messages, outputs, template
// and schedule names, flow keys: whoever can create a task chooses them, and printed raw they could carry
// terminal control sequences (retitle the terminal, move the cursor and rewrite the lines above, hide text).
// The table and text renderers print such values through termSafe, which escapes every control character
// visibly; and everything a command prints in table or text form goes through a termWriter, which escapes the
// control characters a renderer never prints itself (all but newline and tab), so that a value a renderer
// forgot cannot reach the terminal either. JSON output is left byte for byte as it is: encoding/json escapes the
// C0 controls itself, and a JSON consumer wants the data.

// needsEscape reports whether r is shown escaped on a terminal: the C0 controls, DEL, the C1 controls
// (U+0080–U+009F; U+009B is a CSI on terminals that honour 8-bit controls) and the bidirectional formatting
// characters (which reorder what is displayed), and utf8.RuneError (an invalid byte when its size is 1).
func needsEscape(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// escapeTerm returns s with every character needsEscape names written as a Go escape (\t, \n, \x1b, \u009b,
// \u202e) and every invalid UTF-8 byte as \xNN; characters in keep are left as they are.
func escapeTerm(s, keep string) string {
	clean := true
	for i, r := range s {
		if (needsEscape(r) && !strings.ContainsRune(keep, r)) || (r == utf8.RuneError && invalidAt(s, i)) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && invalidAt(s, i):
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case needsEscape(r) && !strings.ContainsRune(keep, r):
			q := strconv.QuoteRune(r) // '\x1b', '\n', '\u009b'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// invalidAt reports whether s holds an invalid UTF-8 byte at i (where range yielded utf8.RuneError).
func invalidAt(s string, i int) bool {
	_, size := utf8.DecodeRuneInString(s[i:])
	return size == 1
}

// termSafe is a client-supplied value as it may appear in a table cell or a line of text: every control
// character escaped, newline and tab included (which would otherwise forge rows and columns).
func termSafe(s string) string { return escapeTerm(s, "") }

// termSafePtr is termSafe of an optional value, "-" when it is nil.
func termSafePtr(s *string) string {
	if s == nil {
		return "-"
	}
	return termSafe(*s)
}

// termWriter escapes, in everything written to it, the control characters other than newline and tab (the
// renderers' own layout). Each Write is escaped on its own: fmt and text/tabwriter never split a character
// across writes.
type termWriter struct{ w io.Writer }

// Write implements io.Writer; it reports len(p) written when the escaped text was written whole.
func (t termWriter) Write(p []byte) (int, error) {
	s := escapeTerm(string(p), "\n\t")
	if _, err := io.WriteString(t.w, s); err != nil {
		return 0, err
	}
	return len(p), nil
}

// printsJSON reports whether cmd prints JSON: its --output (or, for `step resolve`, whose --output is the step's
// output document, --format) is json.
func printsJSON(cmd *cobra.Command) bool {
	name := "output"
	if cmd.Flags().Lookup("format") != nil {
		name = "format"
	}
	f := cmd.Flags().Lookup(name)
	return f != nil && f.Value.String() == outputJSON
}
