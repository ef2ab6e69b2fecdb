package kit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// Command is one saga.command as the handler sees it, after the checks of
// PROTOCOL.md section 7.5 passed.
type Command struct {
	ID            string // ce_id of this copy (unique per delivery, never a dedupe key)
	CommandID     string // ce_commandid: the idempotency key
	Type          string // ce_subject: the command type
	SagaID        string // ce_sagaid (also the record key)
	SagaType      string // ce_sagatype
	Step          string // ce_step ("" when absent)
	Source        string // ce_source
	CorrelationID string // ce_correlationid
	CausationID   string // ce_causationid
	ReplyTo       string // ce_replyto, or {prefix}.inbox when absent
	Time          time.Time
	// SentTime is ce_senttime, when the engine sent it (section 7.4a), as sent.
	SentTime string
	// Received is when the kit read the command (its fetch).
	Received time.Time
	// Compensation is true on a compensating command (ce_compensation: true).
	Compensation bool
	// Compensates lists the forward command ids of ce_compensates.
	Compensates []string
	// ForwardApplied tells, for a command with ce_compensates, whether one of
	// the listed forward command ids has a stored success reply (section 7.3,
	// "Telling that the forward step was never applied").
	ForwardApplied bool
	// Body is the record value, a JSON object.
	Body json.RawMessage
	// Headers holds the last occurrence of every header, empty ones left out.
	Headers map[string]string

	Topic     string
	Partition int32
	Offset    int64

	// progress sends the handler's reports (Progress); nil outside a handler.
	progress *stepProgress
}

// Decode unmarshals the command's body into v.
func (c Command) Decode(v any) error { return json.Unmarshal(c.Body, v) }

// Rejected is the error a handler returns to refuse a command for a business
// reason (section 7.2 step 5): the handler's changes are rolled back to the
// savepoint and the reply is a stored failure with Reason as its error and
// Details as its payload.
//
// (The brief's Rejected{Error, Details} cannot be spelt in Go: a struct cannot
// have both a field and a method named Error, and the method is what makes it
// an error. The field is therefore called Reason.)
type Rejected struct {
	Reason  string
	Details map[string]any
}

func (r *Rejected) Error() string { return "rejected: " + r.Reason }

// Reject returns a *Rejected error.
func Reject(reason string, details map[string]any) error {
	return &Rejected{Reason: reason, Details: details}
}

// Outcomes of a reply (section 7.3).
const (
	OutcomeSuccess   = "success"
	OutcomeFailure   = "failure"
	OutcomeRetryable = "retryable"
)

// replyBody is the value of a saga.reply (reply.schema.json).
type replyBody struct {
	Outcome string          `json:"outcome"`
	Payload json.RawMessage `json:"payload"`
	Error   *string         `json:"error,omitempty"`
}

func failureBody(msg string, details map[string]any) replyBody {
	payload := json.RawMessage("{}")
	if details != nil {
		if raw, err := json.Marshal(details); err == nil {
			payload = raw
		}
	}
	return replyBody{Outcome: OutcomeFailure, Payload: payload, Error: &msg}
}

func (b replyBody) encode() ([]byte, error) {
	if len(b.Payload) == 0 {
		b.Payload = json.RawMessage("{}")
	}
	return json.Marshal(b)
}

// payloadObject turns a handler's result into a reply payload: nil is {},
// anything else must encode to a JSON object. Numbers keep their digits.
func payloadObject(v any) (json.RawMessage, error) {
	if v == nil {
		return json.RawMessage("{}"), nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("the handler's payload does not encode as JSON: %w", err)
	}
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
		return nil, fmt.Errorf("the handler's payload must encode to a JSON object, got %.80s", raw)
	}
	return raw, nil
}
