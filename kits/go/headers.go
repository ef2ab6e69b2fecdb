package kit

import (
	"crypto/rand"
	"fmt"
	"strings"
	"time"
)

// Header is one Kafka record header, in the order the record carries it.
type Header struct {
	Key   string
	Value []byte
}

// Header names of PROTOCOL.md section 3.
const (
	hSpecVersion   = "ce_specversion"
	hContentType   = "content-type"
	hID            = "ce_id"
	hType          = "ce_type"
	hSource        = "ce_source"
	hSagaID        = "ce_sagaid"
	hSchemaVersion = "ce_schemaversion"
	hSubject       = "ce_subject"
	hTime          = "ce_time"
	hSagaType      = "ce_sagatype"
	hCommandID     = "ce_commandid"
	hStep          = "ce_step"
	hCorrelationID = "ce_correlationid"
	hCausationID   = "ce_causationid"
	hReplyTo       = "ce_replyto"
	hCompensation  = "ce_compensation"
	hCompensates   = "ce_compensates"
	hTraceparent   = "traceparent"
	hTracestate    = "tracestate"
	hCodec         = "saga-codec"
)

// lastHeaders maps each header name to its last occurrence (section 3,
// "Duplicate headers"); a name whose last occurrence is empty is left out,
// since an empty value counts as absent.
func lastHeaders(hs []Header) map[string]string {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[h.Key] = string(h.Value)
	}
	for k, v := range m {
		if v == "" {
			delete(m, k)
		}
	}
	return m
}

// newID returns a random (version 4) UUID.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// formatTime writes t as RFC 3339 in UTC with microseconds, as the engine does.
func formatTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000000Z")
}

// replyHeaders builds the headers of a reply answering the copy cmd
// (section 7.4): a new ce_id, ce_causationid naming this copy's ce_id, and
// the trace context of the handler's span. Empty values are left out.
func replyHeaders(source string, cmd *Command, now time.Time, traceparent, tracestate string) []Header {
	pairs := [][2]string{
		{hSpecVersion, "1.0"},
		{hContentType, "application/json"},
		{hID, newID()},
		{hType, "saga.reply"},
		{hSource, source},
		{hTime, formatTime(now)},
		{hSagaID, cmd.SagaID},
		{hCommandID, cmd.CommandID},
		{hCausationID, cmd.ID},
		{hCorrelationID, cmd.CorrelationID},
		{hSchemaVersion, "1"},
		{hTraceparent, traceparent},
		{hTracestate, tracestate},
	}
	out := make([]Header, 0, len(pairs))
	for _, p := range pairs {
		if p[1] != "" {
			out = append(out, Header{Key: p[0], Value: []byte(p[1])})
		}
	}
	return out
}

// splitIDs splits a comma-separated id list (ce_compensates), trimming blanks
// and dropping empty entries.
func splitIDs(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// truncateRunes cuts s to at most n characters.
func truncateRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	count := 0
	for i := range s {
		if count == n {
			return s[:i]
		}
		count++
	}
	return s
}
