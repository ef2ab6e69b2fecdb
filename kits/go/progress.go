package kit

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ProgressMaxBytes is the largest progress record value (the JSON object,
// body included) of PROTOCOL.md section 5b: a larger report is dropped.
const ProgressMaxBytes = 8192

// Progress reports how far the handler got on this command's step: body is
// any value that encodes to JSON (a map, a struct, a string), at most
// ProgressMaxBytes with the record around it. The engine's admin API shows the
// latest reports on the step while it runs (GET /sagas/{id}, the stream with
// ?steps=true, the saga's page); they are not durable.
//
// It never fails the handler and never blocks: the record is sent in the
// background on {prefix}.progress (section 5b), and a report that does not
// encode, is too large or cannot be sent is dropped and counted
// (Kit.ProgressStats). Call it from the handler, on the Command it was given;
// a Command the kit did not hand to a handler reports nothing.
func (c Command) Progress(body any) {
	if c.progress != nil {
		c.progress.report(&c, body)
	}
}

// ProgressStats returns how many progress reports were sent and how many
// were dropped since the kit was made.
func (k *Kit) ProgressStats() (sent, dropped uint64) {
	return k.progressSent.Load(), k.progressDropped.Load()
}

// stepProgress numbers the reports of one run of a handler (one transaction).
type stepProgress struct {
	k       *Kit
	attempt int
	seq     atomic.Int64
}

// progressRecord is the value of a progress record (section 5b).
type progressRecord struct {
	SagaID    string `json:"saga_id"`
	CommandID string `json:"command_id"`
	Step      string `json:"step"`
	Attempt   int    `json:"attempt"`
	Seq       int64  `json:"seq"`
	At        string `json:"at"`
	Body      any    `json:"body"`
}

// withProgress is cmd as its handler gets it: able to report progress as
// the given attempt.
func (k *Kit) withProgress(cmd Command, attempt int) Command {
	cmd.progress = &stepProgress{k: k, attempt: max(attempt, 1)}
	return cmd
}

func (k *Kit) progressTopic() string { return k.cfg.TopicPrefix + ".progress" }

// progressValue encodes one report; an error when it is not JSON or too large.
func progressValue(c *Command, attempt int, seq int64, body any, at time.Time) ([]byte, error) {
	value, err := json.Marshal(progressRecord{
		SagaID: c.SagaID, CommandID: c.CommandID, Step: c.Step, Attempt: attempt,
		Seq: seq, At: at.UTC().Format(time.RFC3339Nano), Body: body,
	})
	if err != nil {
		return nil, fmt.Errorf("the progress body does not encode as JSON: %w", err)
	}
	if len(value) > ProgressMaxBytes {
		return nil, fmt.Errorf("a progress report is %d bytes, over %d", len(value), ProgressMaxBytes)
	}
	return value, nil
}

func (p *stepProgress) report(c *Command, body any) {
	k := p.k
	defer func() {
		if r := recover(); r != nil { // a body whose MarshalJSON panics, say
			k.dropProgress(c, fmt.Errorf("panicked: %v", r))
		}
	}()
	value, err := progressValue(c, p.attempt, p.seq.Add(1), body, time.Now())
	if err != nil {
		k.dropProgress(c, err)
		return
	}
	if k.producer == nil {
		k.dropProgress(c, fmt.Errorf("the kit is not running"))
		return
	}
	rec := &kgo.Record{
		Topic: k.progressTopic(),
		Key:   []byte(c.SagaID),
		Value: value,
		Headers: []kgo.RecordHeader{
			{Key: "ce_type", Value: []byte("saga.progress")},
			{Key: "content-type", Value: []byte("application/json")},
		},
	}
	// TryProduce never blocks: with the producer's buffer full it fails at once.
	k.producer.TryProduce(context.Background(), rec, func(_ *kgo.Record, err error) {
		if err != nil {
			k.dropProgress(c, err)
			return
		}
		k.progressSent.Add(1)
	})
}

// dropProgress counts a dropped report and logs at most one a minute.
func (k *Kit) dropProgress(c *Command, err error) {
	k.progressDropped.Add(1)
	now := time.Now().UnixNano()
	last := k.progressLogged.Load()
	if now-last >= int64(time.Minute) && k.progressLogged.CompareAndSwap(last, now) {
		k.log.Warn("a progress report was dropped; others may follow", "command_id", c.CommandID, "error", err)
	}
}
