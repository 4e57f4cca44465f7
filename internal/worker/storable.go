package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// What PostgreSQL's jsonb cannot hold, and what the executor does about it before an outcome is recorded (issue
// 27 finding 3; docs/retry.md "Outcomes the database cannot store"):
//
//   - Invalid UTF-8 in a string (raw bytes a JSON body or a handler's json.RawMessage carried) and lone UTF-16
//     surrogate escapes ("\ud800" without its pair) are not text: every JSON decoder replaces them, Go's
//     encoding/json with U+FFFD, and PostgreSQL refuses the whole document. They are replaced with U+FFFD.
//   - A NUL character ("\u0000") is valid JSON that jsonb refuses (22P05). In an output or a next input it is
//     data, which a replacement would change silently: the attempt fails with class contract_failure, naming
//     where it is. In an error document (a failure's message, class or stack) it is replaced with U+FFFD: a
//     failure must be recorded.
//
// Whatever else the database refuses (a number beyond numeric's range, collect = merge of a non-object, a size
// limit) it refuses when the outcome is recorded, and the executor records that refusal at once as a
// contract_failure with the database's message (Executor.record).

// storableJSON returns doc, a valid JSON document, with invalid UTF-8 and lone surrogate escapes replaced by
// U+FFFD. A NUL character is replaced too when lossy, else it is an error naming its JSON path. doc itself is
// returned when nothing needs replacing (the common case costs one pass over it and no allocation).
func storableJSON(doc []byte, lossy bool) ([]byte, error) {
	if utf8.Valid(doc) && !bytes.Contains(doc, []byte(`\u`)) {
		return doc, nil
	}
	s := jsonScrubber{in: doc, lossy: lossy}
	if err := s.run(); err != nil {
		return nil, err
	}
	if s.out == nil {
		return doc, nil
	}
	return s.out, nil
}

// jsonScrubber walks a valid JSON document, keeping track of the path, and copies it to out from the first
// replacement on.
type jsonScrubber struct {
	in    []byte
	lossy bool
	out   []byte // nil until something is replaced
	done  int    // in[:done] is accounted for in out
	stack []frame
}

// frame is one open container: an array and the index of its current element, or an object and the raw key of
// its current member (expectKey: the next string is a key).
type frame struct {
	array     bool
	index     int
	key       []byte
	expectKey bool
}

const replacementEscape = `\ufffd`

func (s *jsonScrubber) run() error {
	for i := 0; i < len(s.in); {
		switch c := s.in[i]; c {
		case '{':
			s.stack = append(s.stack, frame{expectKey: true})
			i++
		case '[':
			s.stack = append(s.stack, frame{array: true})
			i++
		case '}', ']':
			if len(s.stack) > 0 { // always, in the valid JSON this is given
				s.stack = s.stack[:len(s.stack)-1]
			}
			i++
		case ',':
			if top := s.top(); top != nil {
				if top.array {
					top.index++
				} else {
					top.expectKey = true
				}
			}
			i++
		case ':':
			if top := s.top(); top != nil {
				top.expectKey = false
			}
			i++
		case '"':
			isKey := false
			if top := s.top(); top != nil && !top.array && top.expectKey {
				isKey = true
			}
			end, err := s.str(i, isKey)
			if err != nil {
				return err
			}
			if isKey {
				s.top().key = s.in[i:end]
			}
			i = end
		default:
			i++
		}
	}
	if s.out != nil {
		s.out = append(s.out, s.in[s.done:]...)
	}
	return nil
}

func (s *jsonScrubber) top() *frame {
	if len(s.stack) == 0 {
		return nil
	}
	return &s.stack[len(s.stack)-1]
}

// replace puts with in place of in[from:to].
func (s *jsonScrubber) replace(from, to int, with string) {
	if s.out == nil {
		s.out = make([]byte, 0, len(s.in)+16)
	}
	s.out = append(s.out, s.in[s.done:from]...)
	s.out = append(s.out, with...)
	s.done = to
}

// str scrubs the string literal that starts at in[q] (the opening quote) and returns the index after its closing
// quote.
func (s *jsonScrubber) str(q int, isKey bool) (int, error) {
	j := q + 1
	for j < len(s.in) {
		c := s.in[j]
		switch {
		case c == '"':
			return j + 1, nil
		case c == '\\' && j+1 < len(s.in) && s.in[j+1] == 'u' && j+6 <= len(s.in):
			r := hex4(s.in[j+2 : j+6])
			switch {
			case r == 0:
				if !s.lossy {
					return 0, fmt.Errorf("%s: a string holds the NUL character (\\u0000), which PostgreSQL "+
						"cannot store in jsonb; encode binary data (base64, hex) instead", s.path(isKey))
				}
				s.replace(j, j+6, replacementEscape)
				j += 6
			case r >= 0xD800 && r <= 0xDBFF:
				if j+12 <= len(s.in) && s.in[j+6] == '\\' && s.in[j+7] == 'u' {
					if lo := hex4(s.in[j+8 : j+12]); lo >= 0xDC00 && lo <= 0xDFFF {
						j += 12 // a surrogate pair: one character
						continue
					}
				}
				s.replace(j, j+6, replacementEscape)
				j += 6
			case r >= 0xDC00 && r <= 0xDFFF:
				s.replace(j, j+6, replacementEscape)
				j += 6
			default:
				j += 6
			}
		case c == '\\':
			j += 2
		case c < utf8.RuneSelf:
			j++
		default:
			r, size := utf8.DecodeRune(s.in[j:])
			if r == utf8.RuneError && size <= 1 {
				s.replace(j, j+1, "\uFFFD")
			}
			j += max(size, 1)
		}
	}
	return j, nil
}

// hex4 decodes four hex digits (valid JSON guarantees them after \u).
func hex4(b []byte) rune {
	n, err := strconv.ParseUint(string(b), 16, 32)
	if err != nil {
		return -1
	}
	return rune(n)
}

// path is the JSON path of the string being scrubbed ("$.body.items[3].name"; a key: that member's name).
func (s *jsonScrubber) path(isKey bool) string {
	var b strings.Builder
	b.WriteString("$")
	for i, f := range s.stack {
		if f.array {
			fmt.Fprintf(&b, "[%d]", f.index)
			continue
		}
		if isKey && i == len(s.stack)-1 {
			b.WriteString(" (a member name)")
			break
		}
		var k string
		if json.Unmarshal(f.key, &k) != nil {
			k = string(f.key)
		}
		if isIdentifier(k) {
			b.WriteString("." + k)
		} else {
			b.WriteString("[" + strconv.Quote(k) + "]")
		}
	}
	return b.String()
}

func isIdentifier(k string) bool {
	if k == "" {
		return false
	}
	for i, r := range k {
		if r != '_' && !(r >= 'a' && r <= 'z') && !(r >= 'A' && r <= 'Z') && !(i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
