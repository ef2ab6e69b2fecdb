package kit

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// dlqTruncateBytes is how much of a value a truncated dead letter keeps.
const dlqTruncateBytes = 65536

// maxDetail is the longest dlq_detail (section 11).
const maxDetail = 2000

func toKgoHeaders(hs []Header) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return out
}

// produce sends one record and waits for the broker's acknowledgement
// (acks=all), retrying with back-off while Kafka is unreachable. It returns
// early, without retrying, when the record is too large (kerr.MessageTooLarge)
// and when ctx ends.
func (k *Kit) produce(ctx context.Context, rec *kgo.Record) error {
	for retry := 0; ; retry++ {
		err := k.producer.ProduceSync(ctx, rec).FirstErr()
		if err == nil {
			return nil
		}
		if errors.Is(err, kerr.MessageTooLarge) || ctx.Err() != nil {
			return err
		}
		k.log.Warn("produce failed; retrying", "topic", rec.Topic, "error", err)
		if !sleep(ctx, paceOutage.delay(retry+1)) {
			return ctx.Err()
		}
		rec = &kgo.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Headers: rec.Headers}
	}
}

// publishReply sends a reply (section 7.2 step 7) and, when it came from the
// outbox, marks its row published.
func (k *Kit) publishReply(ctx context.Context, row *outboxRow) error {
	rec := &kgo.Record{Topic: row.topic, Key: row.key, Value: row.value, Headers: toKgoHeaders(row.headers)}
	if err := k.produce(ctx, rec); err != nil {
		return err
	}
	if row.id == 0 {
		return nil
	}
	for retry := 0; ; retry++ {
		err := k.store.markPublished(ctx, row.id)
		if err == nil {
			return nil
		}
		// Unmarked, the row is sent again at the next start: harmless.
		if ctx.Err() != nil || retry >= 5 {
			k.log.Warn("could not mark a reply published", "outbox_id", row.id, "error", err)
			return nil
		}
		sleep(ctx, paceOutage.delay(retry+1))
	}
}

// relayOutbox publishes every outbox row not marked published, oldest first
// (replies committed before a crash).
func (k *Kit) relayOutbox(ctx context.Context) error {
	sent := 0
	for {
		rows, err := k.store.unpublished(ctx, 500)
		if err != nil {
			return err
		}
		for i := range rows {
			if err := k.ensureTopic(ctx, rows[i].topic); err != nil {
				return err
			}
			if err := k.publishReply(ctx, &rows[i]); err != nil {
				return err
			}
			sent++
		}
		if len(rows) < 500 {
			if sent > 0 {
				k.log.Info("relayed unpublished replies", "count", sent)
			}
			return nil
		}
	}
}

// deadLetterRecord builds the record to {prefix}.dlq for rec (section 11):
// its key, value and headers (minus earlier dlq_* headers) and the dlq_*
// headers. With truncate, the value keeps its first 64 KiB and dlq_truncated
// holds its original length; with cutHeaders too, each original header value
// keeps its first 1 KiB as well (a fall-back PROTOCOL.md does not describe).
func deadLetterRecord(topic, consumer string, rec *Record, reason, detail string, truncate, cutHeaders bool) *kgo.Record {
	var headers []kgo.RecordHeader
	for _, h := range rec.Headers {
		if strings.HasPrefix(h.Key, "dlq_") {
			continue
		}
		v := h.Value
		if cutHeaders && len(v) > 1024 {
			v = v[:1024]
		}
		headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: v})
	}
	headers = append(headers,
		kgo.RecordHeader{Key: "dlq_reason", Value: []byte(reason)},
		kgo.RecordHeader{Key: "dlq_detail", Value: []byte(truncateRunes(detail, maxDetail))},
		kgo.RecordHeader{Key: "dlq_topic", Value: []byte(rec.Topic)},
		kgo.RecordHeader{Key: "dlq_partition", Value: []byte(strconv.FormatInt(int64(rec.Partition), 10))},
		kgo.RecordHeader{Key: "dlq_offset", Value: []byte(strconv.FormatInt(rec.Offset, 10))},
		kgo.RecordHeader{Key: "dlq_consumer", Value: []byte(consumer)},
	)
	value := rec.Value
	if truncate {
		if len(value) > dlqTruncateBytes {
			value = value[:dlqTruncateBytes]
		}
		headers = append(headers, kgo.RecordHeader{Key: "dlq_truncated", Value: []byte(strconv.Itoa(len(rec.Value)))})
	}
	return &kgo.Record{Topic: topic, Key: rec.Key, Value: value, Headers: headers}
}

// deadLetter publishes rec to {prefix}.dlq. It first sends the record whole;
// if the broker or the client refuses it as too large (MESSAGE_TOO_LARGE), it
// sends it again truncated (section 11), and never truncates for another
// error. It returns nil once a dead letter was acknowledged.
func (k *Kit) deadLetter(ctx context.Context, rec *Record, reason, detail string) error {
	var err error
	for _, step := range []struct{ truncate, cutHeaders bool }{{false, false}, {true, false}, {true, true}} {
		err = k.produce(ctx, deadLetterRecord(k.dlqTopic(), k.consumer, rec, reason, detail, step.truncate, step.cutHeaders))
		if !errors.Is(err, kerr.MessageTooLarge) {
			if err == nil {
				k.log.Warn("dead-lettered a record", "reason", reason, "detail", detail, "truncated", step.truncate,
					"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
			}
			return err
		}
	}
	return err
}
