package kit

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// Dead-letter reasons a participant uses (section 11).
const (
	ReasonOversized          = "oversized"
	ReasonMissingHeader      = "missing_header"
	ReasonWrongSchemaVersion = "wrong_schema_version"
	ReasonInvalidBody        = "invalid_body"
	ReasonUnknownType        = "unknown_type"
	ReasonUndecodable        = "undecodable"
	ReasonMalformedJSON      = "malformed_json"
	ReasonKeyMismatch        = "key_mismatch"
	ReasonUnstorableValue    = "unstorable_value"
	ReasonEngineError        = "engine_error"
)

// Record is a consumed Kafka record as the checks see it. A nil Key or Value
// is a Kafka null.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	// wireSize is the record's size as consumed, when Value was resolved from
	// a reference (0: Value and Headers are as consumed).
	wireSize int
}

type verdictKind int

const (
	verdictProcess    verdictKind = iota // every check passed: claim and run the handler
	verdictDeadLetter                    // checks 1-15: dead letter, no reply
	verdictAnswer                        // checks 16-18: a stored failure reply (+ a dead letter for 16, 18)
)

// verdict is the outcome of the checks of section 7.5 on one record.
type verdict struct {
	kind    verdictKind
	check   int    // the number of the first failed check; 0 when all passed
	reason  string // dlq_reason; "" for check 17, which is not dead-lettered
	detail  string
	cmd     *Command // set for verdictProcess and verdictAnswer
	answer  *replyBody
	handler *handler
	attempt int // the handler's attempt at it, from 1 (set by process)
	// refused is the refusal the handler gave on an optimistic pass, answered
	// on the locked one without asking the handler again (set by process).
	refused *refusal
}

// messageTypes are the seven ce_type values of section 5.
var messageTypes = map[string]bool{
	"saga.command": true, "saga.reply": true, "saga.start": true, "saga.signal": true,
	"saga.cancel": true, "saga.reload": true, "saga.undo": true,
}

var (
	topicName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)
	rfc3339   = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$`)
)

// validTime reports whether s is an RFC 3339 date-time.
func validTime(s string) bool {
	if !rfc3339.MatchString(s) {
		return false
	}
	_, err := time.Parse(time.RFC3339Nano, strings.ToUpper(s))
	return err == nil
}

// checker makes the checks of PROTOCOL.md section 7.5, in their order.
type checker struct {
	maxBytes int                 // the message size limit (section 12)
	inbox    string              // the reply topic of a command without ce_replyto
	handlers map[string]*handler // the command types this participant handles
}

func dead(check int, reason, format string, args ...any) verdict {
	return verdict{kind: verdictDeadLetter, check: check, reason: reason, detail: fmt.Sprintf(format, args...)}
}

func (c *checker) check(rec *Record) verdict {
	// 1. the size: value + every header's name and value.
	size := recordSize(rec)
	if size > c.maxBytes {
		return dead(1, ReasonOversized, "the record's value and headers are %d bytes, above the message size limit of %d", size, c.maxBytes)
	}
	// 2. every header is valid UTF-8 (every occurrence, name and value).
	for _, h := range rec.Headers {
		if !utf8.ValidString(h.Key) {
			return dead(2, ReasonMissingHeader, "a header name is not valid UTF-8: %q", h.Key)
		}
		if !utf8.Valid(h.Value) {
			return dead(2, ReasonMissingHeader, "header %s is not valid UTF-8", h.Key)
		}
	}
	hs := lastHeaders(rec.Headers)
	// 3. the required headers.
	for _, name := range []string{hID, hType, hSource, hSagaID, hSchemaVersion} {
		if hs[name] == "" {
			return dead(3, ReasonMissingHeader, "required header %s is missing or empty", name)
		}
	}
	// 4. ce_specversion, if present, is 1.0.
	if v, ok := hs[hSpecVersion]; ok && v != "1.0" {
		return dead(4, ReasonWrongSchemaVersion, "ce_specversion is %q, not 1.0", v)
	}
	// 5. content-type, if present, is application/json (parameters ignored).
	if v, ok := hs[hContentType]; ok {
		media, _, _ := strings.Cut(v, ";")
		if !strings.EqualFold(strings.TrimSpace(media), "application/json") {
			return dead(5, ReasonInvalidBody, "content-type is %q, not application/json", v)
		}
	}
	// 6. ce_schemaversion is 1.
	if v := hs[hSchemaVersion]; v != "1" {
		return dead(6, ReasonWrongSchemaVersion, "ce_schemaversion is %q; this participant reads version 1", v)
	}
	// 7. ce_type is a message type.
	typ := hs[hType]
	if !messageTypes[typ] {
		return dead(7, ReasonUnknownType, "ce_type %q is not a message type", typ)
	}
	// 8. an encoded value: this kit has no payload codec configured (section 15).
	if v, ok := hs[hCodec]; ok {
		return dead(8, ReasonUndecodable, "the value is encoded (saga-codec %q) and this participant has no payload codec configured", v)
	}
	// 9. the value is JSON.
	if rec.Value == nil {
		return dead(9, ReasonMalformedJSON, "the value is null, not JSON")
	}
	info, err := scanJSON(rec.Value)
	if err != nil {
		return dead(9, ReasonMalformedJSON, "%v", err)
	}
	// 10. ce_sagaid is 1 to 200 characters; ce_time is a date-time.
	sagaID := hs[hSagaID]
	if n := utf8.RuneCountInString(sagaID); n < 1 || n > 200 {
		return dead(10, ReasonMissingHeader, "ce_sagaid is %d characters long; at most 200 are allowed", n)
	}
	if v, ok := hs[hTime]; ok && !validTime(v) {
		return dead(10, ReasonMissingHeader, "ce_time %q is not an RFC 3339 date-time", v)
	}
	// 11. the key, if not null, is the saga id.
	if rec.Key != nil && string(rec.Key) != sagaID {
		return dead(11, ReasonKeyMismatch, "the record key %q is not the saga id %q", truncateRunes(string(rec.Key), 200), sagaID)
	}
	// 12. the record is a command.
	if typ != "saga.command" {
		return dead(12, ReasonUnknownType, "ce_type %s is not taken by a participant, which reads saga.command", typ)
	}
	// 13. ce_commandid is 1 to 200 characters.
	commandID := hs[hCommandID]
	if n := utf8.RuneCountInString(commandID); n < 1 || n > 200 {
		if n == 0 {
			return dead(13, ReasonMissingHeader, "ce_commandid is missing or empty")
		}
		return dead(13, ReasonMissingHeader, "ce_commandid is %d characters long; at most 200 are allowed", n)
	}
	// 14. ce_replyto, if present, is a topic name.
	if v, ok := hs[hReplyTo]; ok && !topicName.MatchString(v) {
		return dead(14, ReasonMissingHeader, "ce_replyto %q is not a topic name", truncateRunes(v, 300))
	}
	// 15. the headers the claim stores are storable.
	for _, name := range []string{hCommandID, hSagaID, hStep, hSubject, hCompensates} {
		if strings.ContainsRune(hs[name], 0) {
			return dead(15, ReasonUnstorableValue, "header %s holds a NUL character", name)
		}
	}
	cmd := c.command(rec, hs)
	// 16. the body is storable and nested at most 254 levels.
	if info.tooDeep || info.depth > maxStorableDepth {
		return c.answer(16, ReasonUnstorableValue, cmd, nil, fmt.Sprintf("the body is nested more than %d levels deep", maxStorableDepth))
	}
	if info.problem != "" {
		return c.answer(16, ReasonUnstorableValue, cmd, nil, "the body cannot be stored: "+info.problem)
	}
	// 17. ce_subject names a command type this participant handles.
	h, ok := c.handlers[cmd.Type]
	if !ok {
		known := make([]string, 0, len(c.handlers))
		for name := range c.handlers {
			known = append(known, name)
		}
		sort.Strings(known)
		what := fmt.Sprintf("unknown command type %q", cmd.Type)
		if cmd.Type == "" {
			what = "no command type (ce_subject is absent)"
		}
		return c.answer(17, "", cmd, nil, fmt.Sprintf("%s; this participant handles %s", what, strings.Join(known, ", ")))
	}
	// 18. the body is what the command type's model takes.
	if !info.object {
		return c.answer(18, ReasonInvalidBody, cmd, h, fmt.Sprintf("invalid %s body: the body must be a JSON object", cmd.Type))
	}
	if h.validate != nil {
		if err := h.validate(cmd.Body); err != nil {
			return c.answer(18, ReasonInvalidBody, cmd, h, fmt.Sprintf("invalid %s body: %v", cmd.Type, err))
		}
	}
	return verdict{kind: verdictProcess, cmd: cmd, handler: h}
}

func (c *checker) answer(check int, reason string, cmd *Command, h *handler, msg string) verdict {
	details := map[string]any{"check": check}
	if reason != "" {
		details["reason"] = reason
	}
	body := failureBody(msg, details)
	return verdict{kind: verdictAnswer, check: check, reason: reason, detail: msg, cmd: cmd, answer: &body, handler: h}
}

func (c *checker) command(rec *Record, hs map[string]string) *Command {
	cmd := &Command{
		ID:            hs[hID],
		CommandID:     hs[hCommandID],
		Type:          hs[hSubject],
		SagaID:        hs[hSagaID],
		SagaType:      hs[hSagaType],
		Step:          hs[hStep],
		Source:        hs[hSource],
		CorrelationID: hs[hCorrelationID],
		CausationID:   hs[hCausationID],
		ReplyTo:       hs[hReplyTo],
		SentTime:      hs[hSentTime],
		Compensation:  hs[hCompensation] == "true",
		Compensates:   splitIDs(hs[hCompensates]),
		Body:          rec.Value,
		Headers:       hs,
		Topic:         rec.Topic,
		Partition:     rec.Partition,
		Offset:        rec.Offset,
	}
	if cmd.ReplyTo == "" {
		cmd.ReplyTo = c.inbox
	}
	if v, ok := hs[hTime]; ok {
		cmd.Time, _ = time.Parse(time.RFC3339Nano, strings.ToUpper(v))
	}
	return cmd
}
