package kit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Nesting limits of PROTOCOL.md sections 7.5 and 12.
const (
	// maxStorableDepth is the deepest nesting a stored body may have: 254
	// containers ([] or {} count one level each).
	maxStorableDepth = 254
	// maxParseDepth is the nesting past which no parser reads a JSON text.
	// Such a text passes check 9 and fails check 16.
	maxParseDepth = 1024
)

// jsonInfo is what scanJSON learns about a record value.
type jsonInfo struct {
	depth   int    // the deepest container nesting seen (a scalar is 0)
	tooDeep bool   // nested past maxParseDepth: scanning stopped there
	problem string // the first unstorable value, e.g. `$.a[2] holds a NUL character`
	object  bool   // the top-level value is an object
}

type jsonFrame struct {
	object bool
	index  int
	key    string
}

type jsonScanner struct {
	data  []byte
	pos   int
	stack []jsonFrame
	info  jsonInfo
}

// scanJSON checks that data is one JSON text (RFC 8259, UTF-8, optional
// whitespace around it; no NaN, no Infinity, no trailing second value) and
// records its depth and its first value that Postgres cannot store (section
// 12: a NUL character, an unpaired surrogate escape, an integer outside
// -2^63 .. 2^64-1). It never recurses, so any depth is safe.
func scanJSON(data []byte) (jsonInfo, error) {
	if len(data) == 0 {
		return jsonInfo{}, errors.New("the value is empty")
	}
	if !utf8.Valid(data) {
		return jsonInfo{}, errors.New("the value is not UTF-8")
	}
	s := &jsonScanner{data: data}
	if err := s.run(); err != nil {
		return jsonInfo{}, err
	}
	return s.info, nil
}

func (s *jsonScanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *jsonScanner) errorf(format string, args ...any) error {
	return fmt.Errorf("not JSON at byte %d: %s", s.pos, fmt.Sprintf(format, args...))
}

func (s *jsonScanner) peek() byte {
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

func (s *jsonScanner) run() error {
	expectValue := true
	s.ws()
	if s.pos < len(s.data) {
		s.info.object = s.data[s.pos] == '{'
	}
	for {
		s.ws()
		if expectValue {
			closed, err := s.value()
			if err != nil || s.info.tooDeep {
				return err
			}
			expectValue = !closed
			continue
		}
		if len(s.stack) == 0 {
			if s.pos != len(s.data) {
				return s.errorf("a second value after the first")
			}
			return nil
		}
		top := &s.stack[len(s.stack)-1]
		switch c := s.peek(); {
		case c == ',':
			s.pos++
			if top.object {
				s.ws()
				if err := s.key(top); err != nil {
					return err
				}
			} else {
				top.index++
			}
			expectValue = true
		case top.object && c == '}', !top.object && c == ']':
			s.pos++
			s.stack = s.stack[:len(s.stack)-1]
		default:
			return s.errorf("expected ',' or the end of the container")
		}
	}
}

// value reads one value, or opens a container. closed is true when a complete
// value was read (a scalar or an empty container), false when a container was
// opened and its first member is expected next.
func (s *jsonScanner) value() (closed bool, err error) {
	switch c := s.peek(); {
	case c == '{' || c == '[':
		s.pos++
		s.stack = append(s.stack, jsonFrame{object: c == '{'})
		if len(s.stack) > s.info.depth {
			s.info.depth = len(s.stack)
		}
		if len(s.stack) > maxParseDepth {
			s.info.tooDeep = true
			return false, nil
		}
		s.ws()
		if (c == '{' && s.peek() == '}') || (c == '[' && s.peek() == ']') {
			s.pos++
			s.stack = s.stack[:len(s.stack)-1]
			return true, nil
		}
		if c == '{' {
			return false, s.key(&s.stack[len(s.stack)-1])
		}
		return false, nil
	case c == '"':
		str, err := s.str()
		if err != nil {
			return false, err
		}
		s.noteString(str, "")
		return true, nil
	case c == '-' || (c >= '0' && c <= '9'):
		return true, s.number()
	case c == 't':
		return true, s.literal("true")
	case c == 'f':
		return true, s.literal("false")
	case c == 'n':
		return true, s.literal("null")
	case c == 0 && s.pos >= len(s.data):
		return false, s.errorf("unexpected end")
	default:
		return false, s.errorf("unexpected %q", rune(c))
	}
}

// key reads `"name" :` of an object member into frame.
func (s *jsonScanner) key(frame *jsonFrame) error {
	if s.peek() != '"' {
		return s.errorf("expected a member name")
	}
	str, err := s.str()
	if err != nil {
		return err
	}
	frame.key = str.text
	s.noteString(str, "member name ")
	s.ws()
	if s.peek() != ':' {
		return s.errorf("expected ':'")
	}
	s.pos++
	return nil
}

func (s *jsonScanner) literal(word string) error {
	if !strings.HasPrefix(string(s.data[s.pos:min(len(s.data), s.pos+len(word))]), word) {
		return s.errorf("unexpected literal")
	}
	s.pos += len(word)
	return nil
}

func (s *jsonScanner) number() error {
	start := s.pos
	if s.peek() == '-' {
		s.pos++
	}
	digits := func() int {
		n := 0
		for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
			s.pos++
			n++
		}
		return n
	}
	switch {
	case s.peek() == '0':
		s.pos++
	case s.peek() >= '1' && s.peek() <= '9':
		digits()
	default:
		return s.errorf("bad number")
	}
	integer := true
	if s.peek() == '.' {
		s.pos++
		integer = false
		if digits() == 0 {
			return s.errorf("bad fraction")
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.pos++
		integer = false
		if c := s.peek(); c == '+' || c == '-' {
			s.pos++
		}
		if digits() == 0 {
			return s.errorf("bad exponent")
		}
	}
	if integer && s.info.problem == "" && !storableInteger(string(s.data[start:s.pos])) {
		s.info.problem = s.path("") + " holds an integer outside -2^63 .. 2^64-1"
	}
	return nil
}

// storableInteger reports whether a JSON integer fits a signed or an
// unsigned 64-bit integer (section 12).
func storableInteger(text string) bool {
	if strings.HasPrefix(text, "-") {
		_, err := strconv.ParseInt(text, 10, 64)
		return err == nil
	}
	_, err := strconv.ParseUint(text, 10, 64)
	return err == nil
}

type jsonString struct {
	text     string // the decoded text; unpaired surrogates become U+FFFD
	nul      bool   // holds U+0000
	unpaired bool   // holds an unpaired surrogate escape
}

func (s *jsonScanner) str() (jsonString, error) {
	var out jsonString
	var b strings.Builder
	s.pos++ // the opening quote
	for {
		if s.pos >= len(s.data) {
			return out, s.errorf("unterminated string")
		}
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			out.text = b.String()
			return out, nil
		case c < 0x20:
			return out, s.errorf("control character in a string")
		case c != '\\':
			b.WriteByte(c)
			s.pos++
			continue
		}
		if s.pos+1 >= len(s.data) {
			return out, s.errorf("unterminated escape")
		}
		e := s.data[s.pos+1]
		s.pos += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b', 'f', 'n', 'r', 't':
			b.WriteByte(map[byte]byte{'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}[e])
		case 'u':
			r, ok := s.hex4()
			if !ok {
				return out, s.errorf("bad \\u escape")
			}
			switch {
			case r == 0:
				out.nul = true
				b.WriteRune(0)
			case r >= 0xD800 && r <= 0xDBFF:
				lo, ok := s.lowSurrogate()
				if !ok {
					out.unpaired = true
					b.WriteRune(utf8.RuneError)
					continue
				}
				b.WriteRune(0x10000 + (r-0xD800)<<10 + (lo - 0xDC00))
			case r >= 0xDC00 && r <= 0xDFFF:
				out.unpaired = true
				b.WriteRune(utf8.RuneError)
			default:
				b.WriteRune(r)
			}
		default:
			return out, s.errorf("bad escape")
		}
	}
}

func (s *jsonScanner) hex4() (rune, bool) {
	if s.pos+4 > len(s.data) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(s.data[s.pos:s.pos+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	s.pos += 4
	return rune(v), true
}

// lowSurrogate consumes a following \uDC00-\uDFFF escape, if there is one.
func (s *jsonScanner) lowSurrogate() (rune, bool) {
	if s.pos+6 > len(s.data) || s.data[s.pos] != '\\' || s.data[s.pos+1] != 'u' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(s.data[s.pos+2:s.pos+6]), 16, 32)
	if err != nil || v < 0xDC00 || v > 0xDFFF {
		return 0, false
	}
	s.pos += 6
	return rune(v), true
}

func (s *jsonScanner) noteString(str jsonString, what string) {
	if s.info.problem != "" {
		return
	}
	if str.nul {
		s.info.problem = s.path(what) + " holds a NUL character (\\u0000)"
	} else if str.unpaired {
		s.info.problem = s.path(what) + " holds an unpaired surrogate"
	}
}

// path names the value being read, as $.a[2].b (what is "member name " when
// the problem is in a member name rather than a value).
func (s *jsonScanner) path(what string) string {
	var b strings.Builder
	b.WriteString("$")
	for i, f := range s.stack {
		last := i == len(s.stack)-1
		switch {
		case f.object && last && what != "":
			// the member name itself is being read: name the object
		case f.object:
			b.WriteString("." + f.key)
		default:
			fmt.Fprintf(&b, "[%d]", f.index)
		}
	}
	if what != "" {
		return "a " + what + "in " + b.String()
	}
	return b.String()
}
