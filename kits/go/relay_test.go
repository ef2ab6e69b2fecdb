package kit

import (
	"bytes"
	"strings"
	"testing"
)

func TestDeadLetterRecord(t *testing.T) {
	rec := &Record{Topic: "saga.cmd.p", Partition: 5, Offset: 42, Key: []byte("saga-1"), Value: bytes.Repeat([]byte("v"), 70_000),
		Headers: []Header{{"ce_id", []byte("x")}, {"dlq_reason", []byte("old")}, {"bad", []byte{0xff}}, {"big", bytes.Repeat([]byte("h"), 2000)}}}
	detail := strings.Repeat("d", 2500)
	check := func(truncate, cut bool) map[string]string {
		out := deadLetterRecord("saga.dlq", "participant:p:i", rec, "oversized", detail, truncate, cut)
		if out.Topic != "saga.dlq" || string(out.Key) != "saga-1" {
			t.Fatalf("topic %s key %s", out.Topic, out.Key)
		}
		hs := map[string]string{}
		for _, h := range out.Headers {
			if _, dup := hs[h.Key]; dup {
				t.Fatalf("header %s twice", h.Key)
			}
			hs[h.Key] = string(h.Value)
		}
		want := map[string]string{"dlq_reason": "oversized", "dlq_topic": "saga.cmd.p", "dlq_partition": "5",
			"dlq_offset": "42", "dlq_consumer": "participant:p:i", "ce_id": "x", "bad": "\xff"}
		for k, v := range want {
			if hs[k] != v {
				t.Errorf("%s = %q, want %q", k, hs[k], v)
			}
		}
		if len([]rune(hs["dlq_detail"])) != 2000 {
			t.Errorf("dlq_detail is %d characters", len(hs["dlq_detail"]))
		}
		wantValue := 70_000
		if truncate {
			wantValue = 65536
			if hs["dlq_truncated"] != "70000" {
				t.Errorf("dlq_truncated %q", hs["dlq_truncated"])
			}
		} else if _, ok := hs["dlq_truncated"]; ok {
			t.Errorf("dlq_truncated on a whole record")
		}
		if len(out.Value) != wantValue {
			t.Errorf("value %d bytes, want %d", len(out.Value), wantValue)
		}
		return hs
	}
	if hs := check(false, false); len(hs["big"]) != 2000 {
		t.Errorf("header cut")
	}
	if hs := check(true, false); len(hs["big"]) != 2000 {
		t.Errorf("header cut")
	}
	if hs := check(true, true); len(hs["big"]) != 1024 {
		t.Errorf("header not cut")
	}
	// A null value stays null.
	rec.Value = nil
	if out := deadLetterRecord("saga.dlq", "c", rec, "malformed_json", "", false, false); out.Value != nil {
		t.Errorf("null value became %q", out.Value)
	}
}
