package kit

import (
	"regexp"
	"testing"
	"time"
)

func TestLastHeaders(t *testing.T) {
	hs := lastHeaders([]Header{
		{"a", []byte("1")}, {"a", []byte("2")}, {"b", []byte("x")}, {"b", nil}, {"c", []byte{}}, {"d", []byte("d")},
	})
	if len(hs) != 2 || hs["a"] != "2" || hs["d"] != "d" {
		t.Fatalf("%v", hs)
	}
}

func TestReplyHeaders(t *testing.T) {
	cmd := &Command{ID: "copy-2", CommandID: "cmd-1", SagaID: "saga-1", CorrelationID: "saga-1"}
	now := time.Date(2025, 1, 31, 12, 0, 0, 123456000, time.UTC)
	hs := replyHeaders("/participants/inventory", cmd, now, "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01", "")
	got := map[string]string{}
	for _, h := range hs {
		if _, dup := got[h.Key]; dup {
			t.Fatalf("header %s sent twice", h.Key)
		}
		got[h.Key] = string(h.Value)
	}
	want := map[string]string{
		"ce_specversion": "1.0", "content-type": "application/json", "ce_type": "saga.reply",
		"ce_source": "/participants/inventory", "ce_time": "2025-01-31T12:00:00.123456Z",
		"ce_sagaid": "saga-1", "ce_commandid": "cmd-1", "ce_causationid": "copy-2",
		"ce_correlationid": "saga-1", "ce_schemaversion": "1",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["tracestate"]; ok {
		t.Errorf("an empty tracestate is sent")
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(got["ce_id"]) {
		t.Errorf("ce_id %q is not a UUID", got["ce_id"])
	}
	if len(got) != len(want)+1 {
		t.Errorf("headers %v", got)
	}
	// Without ce_correlationid on the command, the reply leaves it out.
	cmd.CorrelationID = ""
	for _, h := range replyHeaders("/participants/p", cmd, now, "", "") {
		if h.Key == "ce_correlationid" || h.Key == "traceparent" {
			t.Errorf("empty %s is sent", h.Key)
		}
	}
}

func TestSplitIDsAndTruncate(t *testing.T) {
	if ids := splitIDs(" a, b,,c ,"); len(ids) != 3 || ids[0] != "a" || ids[2] != "c" {
		t.Fatalf("%q", ids)
	}
	if splitIDs("") != nil {
		t.Fatal("ids from nothing")
	}
	if s := truncateRunes("ééé", 2); s != "éé" {
		t.Fatalf("%q", s)
	}
	if s := truncateRunes("abc", 5); s != "abc" {
		t.Fatalf("%q", s)
	}
}

func TestTimingHeaders(t *testing.T) {
	sent := "2025-01-31T12:00:00.124012Z"
	cmd := &Command{ID: "c", CommandID: "cmd-1", SagaID: "s", SentTime: sent,
		Received: time.Date(2025, 1, 31, 12, 0, 0, 126530000, time.UTC)}
	now := time.Date(2025, 1, 31, 12, 0, 0, 0, time.UTC)
	echoed := ""
	for _, h := range replyHeaders("/participants/p", cmd, now, "", "") {
		if h.Key == "ce_senttime" {
			echoed = string(h.Value)
		}
	}
	if echoed != sent {
		t.Errorf("ce_senttime %q, want the command's %q", echoed, sent)
	}
	// A command's ce_senttime that is not RFC 3339 is not echoed (section 7.4a:
	// what a reply sends is well-formed).
	cmd.SentTime = "yesterday"
	for _, h := range replyHeaders("/participants/p", cmd, now, "", "") {
		if h.Key == "ce_senttime" {
			t.Errorf("a malformed ce_senttime is echoed: %q", h.Value)
		}
	}
	ran := handlerTimes{start: cmd.Received.Add(time.Millisecond), end: cmd.Received.Add(3 * time.Millisecond)}
	committed := cmd.Received.Add(4 * time.Millisecond)
	got := map[string]string{}
	for _, h := range timingHeaders(cmd, ran, committed) {
		got[h.Key] = string(h.Value)
	}
	want := map[string]string{
		"ce_receivedtime":     "2025-01-31T12:00:00.126530Z",
		"ce_handlerstarttime": "2025-01-31T12:00:00.127530Z",
		"ce_handlerendtime":   "2025-01-31T12:00:00.129530Z",
		"ce_committime":       "2025-01-31T12:00:00.130530Z",
	}
	if len(got) != len(want) {
		t.Errorf("timing headers %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// A duplicate ran no handler: no handler times.
	for _, h := range timingHeaders(cmd, handlerTimes{}, committed) {
		if h.Key == "ce_handlerstarttime" || h.Key == "ce_handlerendtime" {
			t.Errorf("%s sent for a handler that did not run", h.Key)
		}
	}
}
