package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/stepready/stepready/internal/templates"
)

// The file of `scheduler task create -f FILE`, read one definition at a time so that a file of any size is
// created in bounded memory. What the file holds is told from its first lines:
//   - JSON lines (the first non-blank line is a JSON object on its own): one definition per line, blank lines
//     skipped;
//   - otherwise YAML, which JSON is too: documents separated by `---` lines, each one definition, split here
//     line by line (a document marker cannot occur inside a YAML scalar) and decoded one at a time;
//   - a file that is one JSON array or YAML sequence of definitions is read whole (use JSON lines or a YAML
//     stream for very large inputs).
// A file that holds a single definition mapping, and nothing else, is a single task (the output names it).

// fileDefinition is one definition of the file: its JSON and the line it starts on (0 when not known: in a JSON
// array or YAML sequence, read whole).
type fileDefinition struct {
	json json.RawMessage
	line int
}

// definitionFile yields the definitions of a file in order.
type definitionFile struct {
	name string
	f    *os.File
	// next returns the next definition, or io.EOF after the last.
	next func() (fileDefinition, error)
	// single is true when the file holds exactly one definition mapping (not a stream, not a sequence).
	single bool
	// first is the first definition, read when the file was opened.
	first   *fileDefinition
	started bool
}

// openDefinitionFile opens name ("-": standard input) and reads its first definition.
func openDefinitionFile(name string) (*definitionFile, error) {
	f := os.Stdin
	if name != "-" {
		var err error
		if f, err = os.Open(name); err != nil {
			return nil, usageError{err}
		}
	}
	df := &definitionFile{name: name, f: f}
	r := bufio.NewReaderSize(f, 1<<16)
	kind, err := sniff(r)
	if err != nil {
		_ = df.Close()
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	switch kind {
	case jsonLines:
		df.next = jsonLinesReader(name, r)
	case wholeFile:
		data, err := io.ReadAll(r)
		if err != nil {
			_ = df.Close()
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		defs, stream, err := templates.ParseDefinitions(name, data)
		if err != nil {
			_ = df.Close()
			return nil, err
		}
		i := 0
		df.next = func() (fileDefinition, error) {
			if i == len(defs) {
				return fileDefinition{}, io.EOF
			}
			i++
			return fileDefinition{json: defs[i-1]}, nil // no line: the array was parsed whole
		}
		df.single = !stream
	default:
		docs := yamlDocuments(name, r)
		// Decoded once it is known whether the file is a stream: a single document keeps the messages of a
		// single definition (`FILE: …`), the documents of a stream are named by line and index.
		first, err := docs()
		if err != nil && !errors.Is(err, io.EOF) {
			_ = df.Close()
			return nil, err
		}
		second, err2 := docs()
		if err2 != nil && !errors.Is(err2, io.EOF) {
			_ = df.Close()
			return nil, err2
		}
		stream := err2 == nil
		pending := []rawDocument{first, second}[:min(2, btoi(err == nil)+btoi(stream))]
		i := 0
		df.next = func() (fileDefinition, error) {
			var d rawDocument
			if len(pending) > 0 {
				d, pending = pending[0], pending[1:]
			} else {
				var err error
				if d, err = docs(); err != nil {
					return fileDefinition{}, err
				}
			}
			where := name
			if stream {
				where = fmt.Sprintf("%s:%d: definitions[%d]", name, d.line, i)
			}
			i++
			def, err := templates.ParseDefinition(where, d.data)
			if err != nil {
				return fileDefinition{}, err
			}
			return fileDefinition{json: def, line: d.line}, nil
		}
		df.single = !stream
	}
	first, err := df.next()
	switch {
	case errors.Is(err, io.EOF):
		_ = df.Close()
		return nil, fmt.Errorf("%s: empty document", name)
	case err != nil:
		_ = df.Close()
		return nil, err
	}
	df.first = &first
	if kind == jsonLines {
		// One definition and nothing after it: a single task. Otherwise the second is kept for later.
		second, err := df.next()
		switch {
		case errors.Is(err, io.EOF):
			df.single = true
		case err != nil:
			_ = df.Close()
			return nil, err
		default:
			rest := df.next
			pending := &second
			df.next = func() (fileDefinition, error) {
				if pending != nil {
					d := *pending
					pending = nil
					return d, nil
				}
				return rest()
			}
		}
	}
	return df, nil
}

// Next returns the definitions of the file in order, the first one included, then io.EOF.
func (df *definitionFile) Next() (fileDefinition, error) {
	if !df.started {
		df.started = true
		return *df.first, nil
	}
	return df.next()
}

// Close closes the file (not standard input).
func (df *definitionFile) Close() error {
	if df.f == os.Stdin {
		return nil
	}
	return df.f.Close()
}

// fileKind is what a definition file holds.
type fileKind int

const (
	yamlStream fileKind = iota
	jsonLines
	wholeFile
)

// sniff tells the kind of a definition file from its first content line (not blank, not a comment, not a
// document marker or directive), without consuming anything.
func sniff(r *bufio.Reader) (fileKind, error) {
	for n := 4096; ; n *= 2 {
		head, err := r.Peek(n)
		full := errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !errors.Is(err, io.EOF) && !full {
			return 0, err
		}
		rest := bytes.TrimPrefix(head, []byte("\uFEFF"))
		for len(rest) > 0 {
			line, after, complete := bytes.Cut(rest, []byte("\n"))
			if !complete && len(head) == n && !full {
				break // the line goes on past what was peeked: peek more
			}
			if marker, _ := documentMarker(line); marker == "" && !blankYAML(line) {
				t := bytes.TrimLeft(line, " \t")
				switch {
				case t[0] == '[' || (t[0] == '-' && (len(t) == 1 || t[1] == ' ' || t[1] == '\t' || t[1] == '\r')):
					return wholeFile, nil
				case t[0] == '{' && json.Valid(line):
					return jsonLines, nil
				case t[0] == '{' && !complete && full:
					// A first line longer than the reader's buffer: a JSON line (a flow mapping that long is
					// not likely to be YAML).
					return jsonLines, nil
				}
				return yamlStream, nil
			}
			rest = after
			if !complete {
				break
			}
		}
		if len(head) < n || full {
			return yamlStream, nil // nothing but blank lines: the first read reports an empty file
		}
	}
}

// jsonLinesReader reads one definition per non-blank line.
func jsonLinesReader(name string, r *bufio.Reader) func() (fileDefinition, error) {
	line := 0
	return func() (fileDefinition, error) {
		for {
			text, err := r.ReadBytes('\n')
			if len(text) > 0 {
				line++
			}
			if t := bytes.TrimSpace(text); len(t) > 0 {
				if line == 1 {
					t = bytes.TrimPrefix(t, []byte("\uFEFF"))
				}
				if len(t) == 0 || t[0] != '{' || !json.Valid(t) {
					return fileDefinition{}, usagef("%s:%d: not a JSON object (a file of JSON lines holds one task "+
						"definition per line)", name, line)
				}
				return fileDefinition{json: json.RawMessage(bytes.Clone(t)), line: line}, nil
			}
			if errors.Is(err, io.EOF) {
				return fileDefinition{}, io.EOF
			}
			if err != nil {
				return fileDefinition{}, fmt.Errorf("read %s: %w", name, err)
			}
		}
	}
}

// rawDocument is the text of one YAML document of a stream and the line of its first content line.
type rawDocument struct {
	data []byte
	line int
}

// yamlDocuments splits a YAML stream into its documents, one at a time: the lines up to the next document marker
// (`---` at the start of a line, or the end marker `...`). A document with nothing but blank lines and comments is
// skipped.
func yamlDocuments(name string, r *bufio.Reader) func() (rawDocument, error) {
	line := 0
	var doc bytes.Buffer
	start := 0 // the line of the document's first content line
	eof := false
	finish := func() (rawDocument, bool) {
		d := rawDocument{data: bytes.Clone(doc.Bytes()), line: start}
		doc.Reset()
		ok := start != 0
		start = 0
		return d, ok
	}
	return func() (rawDocument, error) {
		for !eof {
			text, err := r.ReadBytes('\n')
			if len(text) > 0 {
				line++
				if line == 1 {
					text = bytes.TrimPrefix(text, []byte("\uFEFF"))
				}
			}
			if errors.Is(err, io.EOF) {
				eof = true
			} else if err != nil {
				return rawDocument{}, fmt.Errorf("read %s: %w", name, err)
			}
			marker, rest := documentMarker(text)
			if marker == "" {
				if start == 0 && !blankYAML(text) {
					start = line
				}
				doc.Write(text)
				continue
			}
			// A marker ends the document so far; `--- content` starts the next one on this line.
			d, ok := finish()
			if marker == "---" && !blankYAML(rest) {
				start = line
				doc.Write(rest)
			}
			if ok {
				return d, nil
			}
		}
		if d, ok := finish(); ok {
			return d, nil
		}
		return rawDocument{}, io.EOF
	}
}

// btoi is 1 for true.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// documentMarker reports whether a line is a YAML document marker ("---" or "..." at the start of the line,
// alone or followed by a space or tab), and what follows it on the line.
func documentMarker(text []byte) (string, []byte) {
	for _, m := range []string{"---", "..."} {
		if bytes.HasPrefix(text, []byte(m)) {
			rest := text[3:]
			if len(bytes.TrimRight(rest, "\r\n")) == 0 || rest[0] == ' ' || rest[0] == '\t' {
				return m, rest
			}
		}
	}
	return "", nil
}

// blankYAML reports whether a line holds nothing but white space, a comment or a directive (%YAML, %TAG).
func blankYAML(text []byte) bool {
	t := bytes.TrimSpace(text)
	return len(t) == 0 || t[0] == '#' || text[0] == '%'
}
