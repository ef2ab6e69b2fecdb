package kit

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

type applyBody struct {
	Key string `json:"key"`
}

func testChecker() *checker {
	noop := func(context.Context, pgx.Tx, Command) (any, error) { return nil, nil }
	apply := &handler{fn: noop}
	WithBody[applyBody]()(apply)
	return &checker{
		maxBytes: 10_000,
		inbox:    "saga.inbox",
		handlers: map[string]*handler{"Apply": apply, "Free": {fn: noop}},
	}
}

// goodRecord is a command that passes every check.
func goodRecord() *Record {
	hs := [][2]string{
		{"ce_specversion", "1.0"}, {"content-type", "application/json"},
		{"ce_id", "id-1"}, {"ce_type", "saga.command"}, {"ce_source", "/saga-engine/e1"},
		{"ce_subject", "Apply"}, {"ce_time", "2025-01-31T12:00:00.123456Z"},
		{"ce_sagaid", "saga-1"}, {"ce_sagatype", "checkout"}, {"ce_commandid", "cmd-1"},
		{"ce_step", "reserve"}, {"ce_correlationid", "saga-1"}, {"ce_causationid", "cmd-1"},
		{"ce_replyto", "saga.inbox"}, {"ce_schemaversion", "1"},
	}
	rec := &Record{Topic: "saga.cmd.p", Partition: 3, Offset: 7, Key: []byte("saga-1"), Value: []byte(`{"key":"k"}`)}
	for _, h := range hs {
		rec.Headers = append(rec.Headers, Header{Key: h[0], Value: []byte(h[1])})
	}
	return rec
}

// set replaces (or, with add, appends) a header; a nil value removes it.
func set(name string, value []byte) func(*Record) {
	return func(r *Record) {
		var out []Header
		for _, h := range r.Headers {
			if h.Key != name {
				out = append(out, h)
			}
		}
		if value != nil {
			out = append(out, Header{Key: name, Value: value})
		}
		r.Headers = out
	}
}

func value(v []byte) func(*Record) { return func(r *Record) { r.Value = v } }
func key(k []byte) func(*Record)   { return func(r *Record) { r.Key = k } }

func TestChecksInOrder(t *testing.T) {
	big := []byte(`{"key":"` + strings.Repeat("x", 10_000) + `"}`)
	cases := []struct {
		name   string
		muts   []func(*Record)
		check  int
		reason string
	}{
		{"oversized", []func(*Record){value(big)}, 1, ReasonOversized},
		{"oversized by headers", []func(*Record){set("x-big", []byte(strings.Repeat("h", 10_000)))}, 1, ReasonOversized},
		{"oversized and no ce_id", []func(*Record){value(big), set("ce_id", nil)}, 1, ReasonOversized},
		{"not utf-8", []func(*Record){set("x-any", []byte{0xff, 0xfe})}, 2, ReasonMissingHeader},
		{"not utf-8 and schema 2", []func(*Record){set("x-any", []byte{0xc3}), set("ce_schemaversion", []byte("2"))}, 2, ReasonMissingHeader},
		{"no ce_id", []func(*Record){set("ce_id", nil)}, 3, ReasonMissingHeader},
		{"empty ce_source", []func(*Record){set("ce_source", []byte{})}, 3, ReasonMissingHeader},
		{"no ce_sagaid", []func(*Record){set("ce_sagaid", nil)}, 3, ReasonMissingHeader},
		{"no ce_schemaversion", []func(*Record){set("ce_schemaversion", nil)}, 3, ReasonMissingHeader},
		{"specversion and content-type", []func(*Record){set("ce_specversion", []byte("0.3")), set("content-type", []byte("text/plain"))}, 4, ReasonWrongSchemaVersion},
		{"content-type and schema 2", []func(*Record){set("content-type", []byte("text/plain")), set("ce_schemaversion", []byte("2"))}, 5, ReasonInvalidBody},
		{"schema 2 and bad type", []func(*Record){set("ce_schemaversion", []byte("2")), set("ce_type", []byte("x"))}, 6, ReasonWrongSchemaVersion},
		{"bad type and not json", []func(*Record){set("ce_type", []byte("saga.nope")), value([]byte("{"))}, 7, ReasonUnknownType},
		{"encoded", []func(*Record){set("saga-codec", []byte("aes-gcm"))}, 8, ReasonUndecodable},
		{"encoded and not json", []func(*Record){set("saga-codec", []byte("zstd")), value([]byte("nope"))}, 8, ReasonUndecodable},
		{"null value", []func(*Record){value(nil)}, 9, ReasonMalformedJSON},
		{"empty value", []func(*Record){value([]byte{})}, 9, ReasonMalformedJSON},
		{"NaN", []func(*Record){value([]byte(`{"a":NaN}`))}, 9, ReasonMalformedJSON},
		{"two values", []func(*Record){value([]byte(`{} {}`))}, 9, ReasonMalformedJSON},
		{"not json and long saga id", []func(*Record){value([]byte("x")), set("ce_sagaid", []byte(strings.Repeat("s", 201)))}, 9, ReasonMalformedJSON},
		{"long saga id", []func(*Record){set("ce_sagaid", []byte(strings.Repeat("s", 201))), key(nil)}, 10, ReasonMissingHeader},
		{"bad time and key mismatch", []func(*Record){set("ce_time", []byte("yesterday")), key([]byte("other"))}, 10, ReasonMissingHeader},
		{"key mismatch and a reply", []func(*Record){key([]byte("other")), set("ce_type", []byte("saga.reply"))}, 11, ReasonKeyMismatch},
		{"empty key", []func(*Record){key([]byte{})}, 11, ReasonKeyMismatch},
		{"a reply", []func(*Record){set("ce_type", []byte("saga.reply"))}, 12, ReasonUnknownType},
		{"a reply without command id", []func(*Record){set("ce_type", []byte("saga.start")), set("ce_commandid", nil)}, 12, ReasonUnknownType},
		{"no command id", []func(*Record){set("ce_commandid", nil)}, 13, ReasonMissingHeader},
		{"long command id", []func(*Record){set("ce_commandid", []byte(strings.Repeat("c", 201)))}, 13, ReasonMissingHeader},
		{"reply-to not a topic", []func(*Record){set("ce_replyto", []byte("a topic"))}, 14, ReasonMissingHeader},
		{"reply-to not a topic and NUL", []func(*Record){set("ce_replyto", []byte("a/b")), set("ce_step", []byte("a\x00"))}, 14, ReasonMissingHeader},
		{"NUL in subject", []func(*Record){set("ce_subject", []byte("Ap\x00ply"))}, 15, ReasonUnstorableValue},
		{"NUL in compensates", []func(*Record){set("ce_compensates", []byte("a,\x00"))}, 15, ReasonUnstorableValue},
		{"NUL in body", []func(*Record){value([]byte(`{"key":"a\u0000"}`))}, 16, ReasonUnstorableValue},
		{"unpaired surrogate", []func(*Record){value([]byte(`{"key":"\ud800"}`))}, 16, ReasonUnstorableValue},
		{"integer too large", []func(*Record){value([]byte(`{"key":"k","n":18446744073709551616}`))}, 16, ReasonUnstorableValue},
		{"too deep", []func(*Record){value([]byte(strings.Repeat("[", 255) + strings.Repeat("]", 255)))}, 16, ReasonUnstorableValue},
		{"NUL and unknown type", []func(*Record){value([]byte(`{"key":"\u0000"}`)), set("ce_subject", []byte("Nope"))}, 16, ReasonUnstorableValue},
		{"unknown type", []func(*Record){set("ce_subject", []byte("Nope"))}, 17, ""},
		{"no subject", []func(*Record){set("ce_subject", nil)}, 17, ""},
		{"unknown type and array", []func(*Record){set("ce_subject", []byte("Nope")), value([]byte(`[1]`))}, 17, ""},
		{"array body", []func(*Record){value([]byte(`[1,2]`))}, 18, ReasonInvalidBody},
		{"null body", []func(*Record){value([]byte(`null`))}, 18, ReasonInvalidBody},
		{"string body, no model", []func(*Record){set("ce_subject", []byte("Free")), value([]byte(`"s"`))}, 18, ReasonInvalidBody},
		{"wrong field type", []func(*Record){value([]byte(`{"key":5}`))}, 18, ReasonInvalidBody},
		{"unknown field", []func(*Record){value([]byte(`{"key":"k","extra":1}`))}, 18, ReasonInvalidBody},
		{"missing field", []func(*Record){value([]byte(`{}`))}, 18, ReasonInvalidBody},
	}
	c := testChecker()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := goodRecord()
			for _, m := range tc.muts {
				m(rec)
			}
			v := c.check(rec)
			if v.check != tc.check || v.reason != tc.reason {
				t.Fatalf("check %d reason %q (%s); want check %d reason %q", v.check, v.reason, v.detail, tc.check, tc.reason)
			}
			wantKind := verdictDeadLetter
			if tc.check >= 16 {
				wantKind = verdictAnswer
			}
			if v.kind != wantKind {
				t.Fatalf("kind %d, want %d", v.kind, wantKind)
			}
			if wantKind == verdictAnswer {
				if v.answer == nil || v.answer.Outcome != OutcomeFailure || v.answer.Error == nil || *v.answer.Error == "" {
					t.Fatalf("answer %+v, want a failure with an error", v.answer)
				}
				if v.cmd == nil || v.cmd.CommandID != "cmd-1" {
					t.Fatalf("answered without its command")
				}
			}
		})
	}
}

func TestChecksPass(t *testing.T) {
	c := testChecker()
	for name, muts := range map[string][]func(*Record){
		"as the engine sends it":      nil,
		"null key":                    {key(nil)},
		"no optional headers":         {set("ce_specversion", nil), set("content-type", nil), set("ce_time", nil), set("ce_replyto", nil), set("ce_step", nil)},
		"content-type with charset":   {set("content-type", []byte("application/json; charset=utf-8"))},
		"empty specversion is absent": {set("ce_specversion", []byte{})},
		"time with offset":            {set("ce_time", []byte("2025-01-31T12:00:00+02:00"))},
		"200-character saga id":       {set("ce_sagaid", []byte(strings.Repeat("é", 200))), key([]byte(strings.Repeat("é", 200)))},
		"254 levels deep":             {set("ce_subject", []byte("Free")), value([]byte(`{"a":` + strings.Repeat("[", 253) + strings.Repeat("]", 253) + `}`))},
		"integers at the edges":       {set("ce_subject", []byte("Free")), value([]byte(`{"a":-9223372036854775808,"b":18446744073709551615,"c":1e400}`))},
		"paired surrogate":            {value([]byte(`{"key":"\ud83d\ude00"}`))},
	} {
		t.Run(name, func(t *testing.T) {
			rec := goodRecord()
			for _, m := range muts {
				m(rec)
			}
			v := c.check(rec)
			if v.kind != verdictProcess {
				t.Fatalf("check %d failed: %s", v.check, v.detail)
			}
		})
	}
}

func TestCheckedCommand(t *testing.T) {
	rec := goodRecord()
	set("ce_replyto", nil)(rec)
	set("ce_compensation", []byte("true"))(rec)
	set("ce_compensates", []byte("f1, f2,,"))(rec)
	v := testChecker().check(rec)
	cmd := v.cmd
	if cmd.ReplyTo != "saga.inbox" || !cmd.Compensation || len(cmd.Compensates) != 2 || cmd.Compensates[1] != "f2" {
		t.Fatalf("command %+v", cmd)
	}
	if cmd.Time.IsZero() || cmd.Step != "reserve" || cmd.Type != "Apply" || cmd.ID != "id-1" {
		t.Fatalf("command %+v", cmd)
	}
}

// Section 3: the last occurrence of a duplicate header wins; an empty last
// one counts as absent.
func TestDuplicateHeaders(t *testing.T) {
	c := testChecker()
	rec := goodRecord()
	rec.Headers = append(rec.Headers, Header{Key: "ce_subject", Value: []byte("Nope")})
	if v := c.check(rec); v.check != 17 || !strings.Contains(v.detail, `"Nope"`) {
		t.Fatalf("last ce_subject did not win: %d %s", v.check, v.detail)
	}
	rec.Headers = append(rec.Headers, Header{Key: "ce_subject", Value: []byte("Apply")})
	if v := c.check(rec); v.kind != verdictProcess {
		t.Fatalf("last ce_subject did not win: %d %s", v.check, v.detail)
	}
	rec.Headers = append(rec.Headers, Header{Key: "ce_subject", Value: nil})
	v := c.check(rec)
	if v.check != 17 || !strings.Contains(v.detail, "absent") {
		t.Fatalf("empty last ce_subject is not absent: %d %s", v.check, v.detail)
	}
	// Check 17's answer names the known types.
	if !strings.Contains(*v.answer.Error, "Apply, Free") {
		t.Fatalf("the answer does not name the known types: %s", *v.answer.Error)
	}
	var body map[string]any
	raw, _ := v.answer.encode()
	if err := json.Unmarshal(raw, &body); err != nil || body["outcome"] != "failure" {
		t.Fatalf("answer %s", raw)
	}
}

func TestValidTime(t *testing.T) {
	for s, want := range map[string]bool{
		"2025-01-31T12:00:00.123456Z": true,
		"2025-01-31T12:00:00Z":        true,
		"2025-01-31t12:00:00z":        true,
		"2025-01-31T12:00:00-05:30":   true,
		"2025-01-31T12:00:00":         false,
		"2025-01-31 12:00:00Z":        false,
		"2025-02-30T12:00:00Z":        false,
		"2025-01-31T25:00:00Z":        false,
		"not-a-time":                  false,
	} {
		if got := validTime(s); got != want {
			t.Errorf("validTime(%q) = %v, want %v", s, got, want)
		}
	}
}
