package docs

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"unicode"
)

// A page's fenced blocks, as the docs test reads them (docs/README.md, "How the docs are tested"):
//
//   - A shell block (```sh, bash, shell, console) carries a mark after its language: `test` (run it; `test poll`:
//     run it, then run its last command again until its output matches the output block), or `skip` followed by
//     the reason it cannot run here. An unmarked shell block fails the test, so no new command goes untested by
//     accident; so does a block without a language that holds commands (commandLine) and is no shell block's output.
//   - The block right after a shell block (only blank lines between), when it has no language or `text`, is its
//     output: the lines the command prints, compared after normalising ids and times (normalise.go).
//   - Any other block with `file=NAME` after its language (```yaml file=etl.yaml) is written to NAME in the
//     page's working directory when the run reaches it: the page shows a file, and the commands after it use it.
//   - A comment `<!-- docs-test: background until "TEXT" COMMAND -->` starts COMMAND in the background (a
//     daemon the page asks the reader to leave running) and waits until it prints TEXT; it is stopped with
//     SIGINT when the page ends.

// block is one fenced code block of a page.
type block struct {
	// file and line locate its opening fence (line numbers from 1).
	file string
	line int
	// lang is the first word of the info string; attrs are the other words.
	lang  string
	attrs []string
	// text is its content, without the fences, dedented by the opening fence's indentation.
	text string
	// endLine is the line of its closing fence.
	endLine int
	// directives are the docs-test comments between the previous block and this one, in page order.
	directives []directive
	// output is the output block that follows a shell block, or nil.
	output *block
}

// where names the block for messages.
func (b *block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// shell reports whether b is a block of shell commands.
func (b *block) shell() bool {
	switch b.lang {
	case "sh", "bash", "shell", "console", "zsh":
		return true
	}
	return false
}

// mark is the block's first attribute: "test", "skip" or "" (unmarked).
func (b *block) mark() string {
	if len(b.attrs) == 0 {
		return ""
	}
	return strings.TrimSuffix(b.attrs[0], ":")
}

// has reports whether the block has the attribute a.
func (b *block) has(a string) bool {
	for _, x := range b.attrs {
		if x == a {
			return true
		}
	}
	return false
}

// fileName is the value of the block's file= attribute, or "".
func (b *block) fileName() string {
	for _, x := range b.attrs {
		if name, ok := strings.CutPrefix(x, "file="); ok {
			return name
		}
	}
	return ""
}

// directive is one `<!-- docs-test: … -->` comment.
type directive struct {
	line int
	// kind is "background".
	kind string
	// until is the text a background command must print before the page goes on.
	until string
	// command is the shell command.
	command string
}

var (
	fenceOpen = regexp.MustCompile("^( *)(`{3,}|~{3,})(.*)$")
	comment   = regexp.MustCompile(`^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$`)
	bgSyntax  = regexp.MustCompile(`^background\s+until\s+"([^"]+)"\s+(.+)$`)
)

// page is a Markdown file's blocks, in order.
type page struct {
	file   string
	blocks []*block
	// trailing are the directives after the last block.
	trailing []directive
	// links are the Markdown links outside code.
	links []link
}

// link is a Markdown link [text](target) of a page.
type link struct {
	line   int
	target string
}

var (
	linkRe     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpanRe = regexp.MustCompile("`+[^`]*`+")
	headingRe  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// headingAnchors returns the anchors GitHub gives the headings of a Markdown text: lower case, punctuation
// dropped, spaces as hyphens, a repeated anchor numbered (-1, -2…).
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	inBlock := ""
	for _, line := range strings.Split(text, "\n") {
		if m := fenceOpen.FindStringSubmatch(line); m != nil {
			if inBlock == "" {
				inBlock = m[2][:1]
			} else if m[2][:1] == inBlock && strings.TrimSpace(m[3]) == "" {
				inBlock = ""
			}
			continue
		}
		if inBlock != "" {
			continue
		}
		m := headingRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// readPage reads and parses the Markdown file at path; name is how messages call it.
func readPage(path, name string) (*page, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parsePage(name, string(data))
}

// parsePage splits a Markdown text into its fenced blocks, with the directives before each and every shell
// block's output block.
func parsePage(name, text string) (*page, error) {
	p := &page{file: name}
	lines := strings.Split(text, "\n")
	var pending []directive
	var prev *block
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := comment.FindStringSubmatch(line); m != nil {
			d, err := parseDirective(m[1])
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", name, i+1, err)
			}
			d.line = i + 1
			pending = append(pending, d)
			continue
		}
		m := fenceOpen.FindStringSubmatch(line)
		if m == nil {
			for _, l := range linkRe.FindAllStringSubmatch(codeSpanRe.ReplaceAllString(line, ""), -1) {
				p.links = append(p.links, link{line: i + 1, target: l[1]})
			}
			continue
		}
		indent, fence, info := len(m[1]), m[2], strings.Fields(m[3])
		b := &block{file: name, line: i + 1, directives: pending}
		pending = nil
		if len(info) > 0 {
			b.lang, b.attrs = info[0], info[1:]
		}
		var body []string
		closed := false
		for i++; i < len(lines); i++ {
			l := lines[i]
			t := strings.TrimLeft(l, " ")
			if strings.HasPrefix(t, fence[:1]) && strings.Trim(t, fence[:1]+" ") == "" &&
				len(strings.TrimRight(t, " ")) >= len(fence) {
				closed = true
				break
			}
			cut := 0
			for cut < indent && cut < len(l) && l[cut] == ' ' {
				cut++
			}
			body = append(body, l[cut:])
		}
		if !closed {
			return nil, fmt.Errorf("%s:%d: a fenced block that never closes", name, b.line)
		}
		b.endLine = i + 1
		b.text = strings.Join(body, "\n")
		if prev != nil && prev.shell() && (b.lang == "" || b.lang == "text") && len(b.directives) == 0 &&
			onlyBlank(lines[prev.endLine:b.line-1]) {
			prev.output = b
		}
		p.blocks = append(p.blocks, b)
		prev = b
	}
	p.trailing = pending
	return p, nil
}

// parseDirective reads the text of a docs-test comment.
func parseDirective(s string) (directive, error) {
	if m := bgSyntax.FindStringSubmatch(s); m != nil {
		return directive{kind: "background", until: m[1], command: m[2]}, nil
	}
	return directive{}, fmt.Errorf("docs-test comment %q: want background until \"TEXT\" COMMAND", s)
}

// onlyBlank reports whether every line is blank.
func onlyBlank(lines []string) bool {
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			return false
		}
	}
	return true
}

// checkMarks returns a problem for every shell block of p that is not marked as the docs test wants, that calls
// bin/scheduler instead of the installed scheduler, or that is a poll block whose last command cannot be run
// again on its own.
func checkMarks(p *page) []string {
	var problems []string
	outputs := map[*block]bool{}
	for _, b := range p.blocks {
		if b.output != nil {
			outputs[b.output] = true
		}
	}
	for _, b := range p.blocks {
		if !b.shell() {
			if (b.lang == "" || b.lang == "text") && !outputs[b] && commandLine.MatchString(b.text) {
				problems = append(problems, fmt.Sprintf("%s: commands in a block without a shell language: write ```sh test (run by the docs test) or ```sh skip: REASON",
					b.where()))
			}
			continue
		}
		if strings.Contains(b.text, "bin/scheduler") {
			problems = append(problems, fmt.Sprintf("%s: write `scheduler …`, the installed command (README: make install), not bin/scheduler",
				b.where()))
		}
		switch b.mark() {
		case "test":
			for _, a := range b.attrs[1:] {
				if a != "poll" {
					problems = append(problems, fmt.Sprintf("%s: unknown attribute %q (want `test` or `test poll`)",
						b.where(), a))
				}
			}
			if b.has("poll") {
				if b.output == nil {
					problems = append(problems, fmt.Sprintf("%s: `test poll` without an output block to wait for", b.where()))
				}
				if _, _, err := splitLast(b.text); err != nil {
					problems = append(problems, fmt.Sprintf("%s: %v", b.where(), err))
				}
			}
		case "skip":
			if len(b.attrs) < 2 {
				problems = append(problems, fmt.Sprintf("%s: `skip` without a reason (write ```%s skip: why it cannot run in the docs test)",
					b.where(), b.lang))
			}
		default:
			problems = append(problems, fmt.Sprintf("%s: shell block not marked: write ```%s test (run by the docs test) or ```%s skip: REASON",
				b.where(), b.lang, b.lang))
		}
	}
	return problems
}

// commandLine matches a line that runs a command the docs test could run: `scheduler …`, `make …`, `psql …`,
// `go …`, or a prompt `$ …`.
var commandLine = regexp.MustCompile(`(?m)^\s*(\$ |(scheduler|make|psql|go) )`)

// heredocStart matches the start of a here-document and captures its delimiter.
var heredocStart = regexp.MustCompile(`<<-?\s*['"]?([A-Za-z_][A-Za-z0-9_]*)['"]?`)

// splitLast splits a block of shell commands into everything before its last command and its last command (a
// line, with the lines it continues with a trailing backslash). The last command must not be part of a
// here-document.
func splitLast(text string) (prefix, last string, err error) {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	// Logical lines: a line ending in a backslash continues on the next one; here-documents belong to the line
	// that opens them.
	type logical struct{ from, to int }
	var cmds []logical
	for i := 0; i < len(lines); i++ {
		from := i
		for strings.HasSuffix(lines[i], `\`) && i+1 < len(lines) {
			i++
		}
		if m := heredocStart.FindStringSubmatch(lines[from]); m != nil {
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != m[1]; i++ {
			}
			if i >= len(lines) {
				return "", "", fmt.Errorf("here-document %s never ends", m[1])
			}
		}
		t := strings.TrimSpace(lines[from])
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		cmds = append(cmds, logical{from, i})
	}
	if len(cmds) == 0 {
		return "", "", fmt.Errorf("no command to run")
	}
	l := cmds[len(cmds)-1]
	if heredocStart.MatchString(lines[l.from]) {
		return "", "", fmt.Errorf("the last command of a `test poll` block is run again: it cannot hold a here-document")
	}
	return strings.Join(lines[:l.from], "\n"), strings.Join(lines[l.from:l.to+1], "\n"), nil
}
