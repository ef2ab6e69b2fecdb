package kit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

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
		if !sleep(ctx, backoff(k.cfg.RetryBackoff, retry, 5*time.Second)) {
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
		sleep(ctx, backoff(k.cfg.RetryBackoff, retry, 5*time.Second))
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

// deadLetter publishes rec to {prefix}.dlq with the dlq_* headers of section
// 11, keeping its key, value and headers (minus earlier dlq_* headers). A
// record the broker or client refuses as too large is sent again with its
// value cut to 64 KiB and dlq_truncated set.
func (k *Kit) deadLetter(ctx context.Context, rec *Record, reason, detail string) error {
	var headers []kgo.RecordHeader
	for _, h := range rec.Headers {
		if !strings.HasPrefix(h.Key, "dlq_") {
			headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
	}
	dlq := []kgo.RecordHeader{
		{Key: "dlq_reason", Value: []byte(reason)},
		{Key: "dlq_detail", Value: []byte(truncateRunes(detail, maxDetail))},
		{Key: "dlq_topic", Value: []byte(rec.Topic)},
		{Key: "dlq_partition", Value: []byte(strconv.FormatInt(int64(rec.Partition), 10))},
		{Key: "dlq_offset", Value: []byte(strconv.FormatInt(rec.Offset, 10))},
		{Key: "dlq_consumer", Value: []byte(k.consumer)},
	}
	out := &kgo.Record{Topic: k.dlqTopic(), Key: rec.Key, Value: rec.Value, Headers: append(headers, dlq...)}
	err := k.produce(ctx, out)
	if err == nil || !errors.Is(err, kerr.MessageTooLarge) {
		if err == nil {
			k.log.Warn("dead-lettered a record", "reason", reason, "detail", detail,
				"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
		}
		return err
	}
	value := rec.Value
	if len(value) > dlqTruncateBytes {
		value = value[:dlqTruncateBytes]
	}
	truncated := append(append([]kgo.RecordHeader{}, out.Headers...),
		kgo.RecordHeader{Key: "dlq_truncated", Value: []byte(strconv.Itoa(len(rec.Value)))})
	out = &kgo.Record{Topic: k.dlqTopic(), Key: rec.Key, Value: value, Headers: truncated}
	err = k.produce(ctx, out)
	if errors.Is(err, kerr.MessageTooLarge) {
		// The headers alone are too large: PROTOCOL.md does not say what to
		// do. Keep every header name, cut each original value to 1 KiB, so
		// that the record is dead-lettered rather than stalling its partition.
		for i := range headers {
			if len(headers[i].Value) > 1024 {
				headers[i].Value = headers[i].Value[:1024]
			}
		}
		out = &kgo.Record{Topic: k.dlqTopic(), Key: rec.Key, Value: value, Headers: append(headers, truncated[len(truncated)-7:]...)}
		err = k.produce(ctx, out)
	}
	if err == nil {
		k.log.Warn("dead-lettered a record, truncated", "reason", reason, "detail", detail,
			"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "size", len(rec.Value))
	}
	return err
}
