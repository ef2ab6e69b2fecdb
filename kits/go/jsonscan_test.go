package kit

import (
	"strings"
	"testing"
)

func nested(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

func TestScanJSONValidity(t *testing.T) {
	valid := []string{
		`{}`, `[]`, `null`, `0`, `-0`, `1.5e-3`, `"s"`, `true`, ` {"a" : [1, {"b": null}] } `,
		"\t\r\n[1]\n", `"\u00e9\n\"\\\/"`, `{"a":{"a":1},"a":2}`, nested(1024), nested(5000),
		strings.Repeat("[", 2000), // past 1,024 levels: no parser reads it, it is not malformed
	}
	for _, s := range valid {
		if _, err := scanJSON([]byte(s)); err != nil {
			t.Errorf("scanJSON(%.40q): %v", s, err)
		}
	}
	invalid := []string{
		``, ` `, `{`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `NaN`, `Infinity`, `-Infinity`,
		`01`, `1.`, `.5`, `1e`, `+1`, `{} {}`, `[1] x`, `"a` + "\x01" + `"`, `"\x"`, `"\u12"`,
		`tru`, `nul`, "\xef\xbb\xbf{}", "\"\xff\"", `'a'`, nested(1000) + "]",
	}
	for _, s := range invalid {
		if _, err := scanJSON([]byte(s)); err == nil {
			t.Errorf("scanJSON(%.40q) accepted", s)
		}
	}
}

func TestScanJSONDepth(t *testing.T) {
	for _, tc := range []struct {
		text    string
		depth   int
		tooDeep bool
	}{
		{`1`, 0, false}, {`{}`, 1, false}, {`{"a":[{}]}`, 3, false},
		{nested(254), 254, false}, {nested(255), 255, false},
		{nested(1024), 1024, false}, {nested(1025), 1025, true},
	} {
		info, err := scanJSON([]byte(tc.text))
		if err != nil || info.depth != tc.depth || info.tooDeep != tc.tooDeep {
			t.Errorf("%.20q: depth %d tooDeep %v err %v; want %d %v", tc.text, info.depth, info.tooDeep, err, tc.depth, tc.tooDeep)
		}
	}
}

func TestScanJSONStorable(t *testing.T) {
	for text, want := range map[string]string{
		`{"a":"x"}`:                        "",
		`{"a":"\u0000"}`:                   "$.a holds a NUL character",
		`{"a":["ok","\u0000"]}`:            "$.a[1] holds a NUL character",
		`{"a\u0000b":1}`:                   "a member name in $ holds a NUL character",
		`{"a":"\ud800"}`:                   "$.a holds an unpaired surrogate",
		`{"a":"\udc00\ud800"}`:             "$.a holds an unpaired surrogate",
		`{"a":"\ud800x"}`:                  "$.a holds an unpaired surrogate",
		`{"a":"\ud83d\ude00"}`:             "",
		`[9223372036854775807]`:            "",
		`[-9223372036854775808]`:           "",
		`[-9223372036854775809]`:           "$[0] holds an integer outside",
		`[18446744073709551615]`:           "",
		`[18446744073709551616]`:           "$[0] holds an integer outside",
		`[1e999, 18446744073709551616.0]`:  "",
		`{"a":{"b":[1,2,{"c":"\u0000"}]}}`: "$.a.b[2].c holds a NUL character",
	} {
		info, err := scanJSON([]byte(text))
		if err != nil {
			t.Fatalf("%s: %v", text, err)
		}
		if (want == "") != (info.problem == "") || !strings.HasPrefix(info.problem, want) {
			t.Errorf("%s: problem %q, want %q", text, info.problem, want)
		}
	}
}

func TestScanJSONObject(t *testing.T) {
	for text, want := range map[string]bool{` {"a":1}`: true, `[]`: false, `null`: false, `"{"`: false} {
		if info, _ := scanJSON([]byte(text)); info.object != want {
			t.Errorf("%s: object %v", text, info.object)
		}
	}
}
