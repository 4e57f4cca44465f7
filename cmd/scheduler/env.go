package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Every flag of every command also reads the environment: --poll-interval reads STEPREADY_POLL_INTERVAL, and
// --database-url reads STEPREADY_DATABASE_URL, then DATABASE_URL. A flag on the command line wins over the
// environment, which wins over the default. Empty variables count as unset. Commands get this by being part of
// the tree made by newRootCommand (its PersistentPreRunE calls applyEnv); nothing needs to be declared per flag.

// envPrefix starts the environment variable of every flag.
const envPrefix = "STEPREADY_"

// defaultTextAnnotation, on a flag, replaces its default value in --help (for defaults computed at run time,
// such as the worker id).
const defaultTextAnnotation = "stepready_default_text"

// envNames returns the environment variables flag f reads, first match wins.
func envNames(f *pflag.Flag) []string {
	names := []string{envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))}
	if f.Name == "database-url" {
		names = append(names, "DATABASE_URL")
	}
	return names
}

// applyEnv sets every flag of cmd that was not given on the command line from its environment variables. The
// help flag is left alone. A value that does not parse is an error naming the variable.
func applyEnv(cmd *cobra.Command, lookup func(string) (string, bool)) error {
	var errs []error
	flags := cmd.Flags()
	flags.VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "help" {
			return
		}
		for _, name := range envNames(f) {
			value, ok := lookup(name)
			if !ok || strings.TrimSpace(value) == "" {
				continue
			}
			if err := flags.Set(f.Name, strings.TrimSpace(value)); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q (for --%s): %w", name, value, f.Name, err))
			}
			return
		}
	})
	return errors.Join(errs...)
}

// setDefaultText makes --help show text as the default of flag name of fs.
func setDefaultText(fs *pflag.FlagSet, name, text string) {
	if err := fs.SetAnnotation(name, defaultTextAnnotation, []string{text}); err != nil {
		panic(err) // a programming error: the flag does not exist
	}
}

// flagUsages renders the flags of fs like pflag does, but always with the default and the environment
// variables: "--lease duration   attempt lease … (default 30s; env STEPREADY_LEASE)".
func flagUsages(fs *pflag.FlagSet) string {
	type row struct{ left, usage, suffix string }
	var rows []row
	width := 0
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		left := "      --" + f.Name
		if f.Shorthand != "" {
			left = "  -" + f.Shorthand + ", --" + f.Name
		}
		varname, usage := pflag.UnquoteUsage(f)
		if varname != "" {
			left += " " + varname
		}
		suffix := ""
		if f.Name != "help" {
			suffix = fmt.Sprintf("(default %s; env %s)", defaultText(f), strings.Join(envNames(f), ", "))
		}
		width = max(width, len(left))
		rows = append(rows, row{left, usage, suffix})
	})
	var b strings.Builder
	for _, r := range rows {
		indent := strings.Repeat(" ", width+3)
		// The description wraps at spaces; "(default …; env …)" stays in one piece.
		lineWidth := max(helpWidth-len(indent), 40)
		lines := wrapWords(r.usage, lineWidth)
		if last := lines[len(lines)-1]; r.suffix != "" && len(last)+1+len(r.suffix) <= lineWidth {
			lines[len(lines)-1] = last + " " + r.suffix
		} else if r.suffix != "" {
			lines = append(lines, r.suffix)
		}
		for i, line := range lines {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s   %s\n", width, r.left, line)
			} else {
				fmt.Fprintf(&b, "%s%s\n", indent, line)
			}
		}
	}
	return b.String()
}

// helpWidth is the width --help wraps flag descriptions at.
const helpWidth = 120

// wrapWords splits text into lines of at most width characters, at spaces (a longer word gets a line of its
// own).
func wrapWords(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	return append(lines, line)
}

// defaultText is the default of f as --help shows it.
func defaultText(f *pflag.Flag) string {
	if text := f.Annotations[defaultTextAnnotation]; len(text) > 0 {
		return text[0]
	}
	if f.Value.Type() == "string" {
		return fmt.Sprintf("%q", f.DefValue)
	}
	return f.DefValue
}

func init() {
	cobra.AddTemplateFunc("flagUsages", flagUsages)
}

// usageTemplate is cobra's usage template with the flag listings rendered by flagUsages.
func usageTemplate(root *cobra.Command) string {
	t := root.UsageTemplate()
	t = strings.Replace(t, "{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}",
		"{{flagUsages .LocalFlags | trimTrailingWhitespaces}}", 1)
	t = strings.Replace(t, "{{.InheritedFlags.FlagUsages | trimTrailingWhitespaces}}",
		"{{flagUsages .InheritedFlags | trimTrailingWhitespaces}}", 1)
	return t
}

// usageError is a mistake on the command line or in the environment: the process exits with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef returns a usageError.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// exitCode is the process exit status for the error a command returned: 0, 2 for usage errors, else 1.
func exitCode(err error) int {
	var u usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &u):
		return 2
	default:
		return 1
	}
}

// usageArgs wraps a cobra argument check so that its failures are usage errors.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}
