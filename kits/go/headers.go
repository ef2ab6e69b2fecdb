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

// The timing headers of PROTOCOL.md section 7.4a: optional, each well-formed
// when sent. The Go kit sends all but ce_handlercpums (Go cannot attribute
// CPU time to one goroutine).
const (
	hSentTime         = "ce_senttime"
	hReceivedTime     = "ce_receivedtime"
	hHandlerStartTime = "ce_handlerstarttime"
	hHandlerEndTime   = "ce_handlerendtime"
	hCommitTime       = "ce_committime"
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
		// Echoed from the command (section 7.4a), only when well-formed.
		{hSentTime, wellFormedTime(cmd.SentTime)},
	}
	out := make([]Header, 0, len(pairs))
	for _, p := range pairs {
		if p[1] != "" {
			out = append(out, Header{Key: p[0], Value: []byte(p[1])})
		}
	}
	return out
}

// wellFormedTime returns v when it is an RFC 3339 time with its offset, else "".
func wellFormedTime(v string) string {
	if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
		return ""
	}
	return v
}

// handlerTimes is when a command's handler started and ended (zero: it did
// not run in the transaction that committed).
type handlerTimes struct{ start, end time.Time }

// timingHeaders are the timing headers a reply gets once its transaction
// committed (section 7.4a): when the command was read, when its handler ran
// (if it did) and when the transaction committed.
func timingHeaders(cmd *Command, ran handlerTimes, committed time.Time) []Header {
	pairs := [][2]string{{hReceivedTime, formatTime(cmd.Received)}}
	if !ran.start.IsZero() {
		pairs = append(pairs, [2]string{hHandlerStartTime, formatTime(ran.start)},
			[2]string{hHandlerEndTime, formatTime(ran.end)})
	}
	pairs = append(pairs, [2]string{hCommitTime, formatTime(committed)})
	out := make([]Header, 0, len(pairs))
	for _, p := range pairs {
		out = append(out, Header{Key: p[0], Value: []byte(p[1])})
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
