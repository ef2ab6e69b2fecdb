package kit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Run creates the kit's tables and topics, publishes the replies left in the
// outbox, then consumes {prefix}.cmd.{Name} until ctx is cancelled. It then
// finishes the batch in hand (for at most Config.ShutdownTimeout), commits
// its offsets and returns nil. It returns an error only when it cannot start.
func (k *Kit) Run(ctx context.Context) error {
	k.mu.Lock()
	if k.running {
		k.mu.Unlock()
		return errors.New("kit: Run called twice")
	}
	k.running = true
	chk := &checker{maxBytes: k.cfg.MaxMessageBytes, inbox: k.inboxTopic(), handlers: k.handlers}
	k.mu.Unlock()

	// Work continues past ctx's cancellation, for the batch in hand.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(k.cfg.ShutdownTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stop()

	limit := int32(k.cfg.MaxMessageBytes + 65536)
	producer, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(k.cfg.Brokers...),
		kgo.ClientID("saga-participant-" + k.cfg.Name),
		kgo.RequiredAcks(kgo.AllISRAcks()),         // acks=all, idempotent (section 7.6)
		kgo.RecordPartitioner(recordPartitioner()), // murmur2 for keyed records (section 2)
		kgo.ProducerBatchMaxBytes(limit),           // max.request.size
		kgo.MaxBufferedBytes(int(limit) * 4),
	}, k.cfg.KafkaOptions...)...)
	if err != nil {
		return fmt.Errorf("kit: producer: %w", err)
	}
	defer producer.Close()
	k.producer = producer

	if err := k.untilReachable(ctx, "Postgres", k.store.migrate); err != nil {
		return fmt.Errorf("kit: %w", err)
	}
	if k.cfg.DrillLedger {
		if err := k.store.migrateLedger(ctx); err != nil {
			return fmt.Errorf("kit: %w", err)
		}
	}
	for _, topic := range []string{k.commandTopic(), k.dlqTopic(), k.progressTopic()} {
		if err := k.ensureTopic(ctx, topic); err != nil {
			return fmt.Errorf("kit: topic %s: %w", topic, err)
		}
	}
	if err := k.relayOutbox(ctx); err != nil {
		return fmt.Errorf("kit: relay the outbox: %w", err)
	}

	consumer, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(k.cfg.Brokers...),
		kgo.ClientID("saga-participant-" + k.cfg.Name),
		kgo.ConsumerGroup(k.cfg.GroupID),
		kgo.ConsumeTopics(k.commandTopic()),
		kgo.DisableAutoCommit(),
		kgo.ConsumeStartOffset(kgo.NewOffset().AtStart()), // auto.offset.reset=earliest
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.InstanceID(k.cfg.InstanceID), // static membership
		kgo.SessionTimeout(k.cfg.SessionTimeout),
		kgo.HeartbeatInterval(k.cfg.HeartbeatInterval),
		kgo.Balancers(kgo.CooperativeStickyBalancer()), // one assignor
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchMaxPartitionBytes(limit),
		kgo.FetchMaxBytes(max(limit, 50<<20)),
	}, k.cfg.KafkaOptions...)...)
	if err != nil {
		return fmt.Errorf("kit: consumer: %w", err)
	}
	defer consumer.Close()
	k.log.Info("participant running", "topic", k.commandTopic(), "group", k.cfg.GroupID,
		"instance", k.cfg.InstanceID, "session_timeout", k.cfg.SessionTimeout)

	for {
		fetches := consumer.PollRecords(ctx, 1000)
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				k.log.Warn("fetch error", "topic", topic, "partition", partition, "error", err)
			}
		})
		k.processBatch(work, consumer, chk, fetches)
		consumer.AllowRebalance()
		if ctx.Err() != nil {
			k.log.Info("participant stopped")
			return nil
		}
	}
}

// recordPartitioner is the producer's partitioner: franz-go's key
// partitioner with its default hasher, Kafka's murmur2 (seed 0x9747b28c,
// masked with 0x7fffffff, modulo the partition count), as Java's default for
// keyed records (section 2; the vectors are checked in murmur2_test.go).
func recordPartitioner() kgo.Partitioner { return kgo.StickyKeyPartitioner(nil) }

// processBatch processes each partition's records in order, the partitions
// concurrently, and commits each partition's offsets once its records are
// done (section 7.2 step 8).
func (k *Kit) processBatch(ctx context.Context, consumer *kgo.Client, chk *checker, fetches kgo.Fetches) {
	var wg sync.WaitGroup
	fetched := time.Now() // ce_receivedtime of the batch's commands (section 7.4a)
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		wg.Go(func() {
			var done *kgo.Record
			for _, r := range p.Records {
				if err := k.handleRecord(ctx, chk, r, fetched); err != nil {
					k.log.Warn("stopped before a record was done; it will be delivered again",
						"partition", r.Partition, "offset", r.Offset, "error", err)
					break
				}
				done = r
			}
			if done != nil {
				if err := consumer.CommitRecords(ctx, done); err != nil {
					k.log.Warn("offset commit failed; the records will be delivered again", "partition", done.Partition, "error", err)
				}
			}
		})
	})
	wg.Wait()
}

// handleRecord makes the checks of section 7.5 on one record, then dead-letters
// it, or processes it and publishes its reply. It returns an error only when
// ctx ended before the record was done.
func (k *Kit) handleRecord(ctx context.Context, chk *checker, r *kgo.Record, fetched time.Time) (err error) {
	rec := &Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value}
	for _, h := range r.Headers {
		rec.Headers = append(rec.Headers, Header{Key: h.Key, Value: h.Value})
	}
	defer func() {
		if p := recover(); p != nil {
			k.log.Error("participant error on a record", "offset", r.Offset, "panic", p)
			err = k.finishDeadLetter(ctx, rec, ReasonEngineError, fmt.Sprintf("participant error: %v", p))
		}
	}()
	work, err := k.resolveRecord(ctx, rec)
	var be *blobError
	if errors.As(err, &be) {
		return k.finishDeadLetter(ctx, rec, be.reason, be.detail)
	}
	if err != nil {
		return err
	}
	v := chk.check(work)
	if v.kind == verdictDeadLetter {
		return k.finishDeadLetter(ctx, rec, v.reason, v.detail)
	}
	v.cmd.Received = fetched
	row, err := k.process(ctx, v)
	var ee *engineError
	if errors.As(err, &ee) {
		k.log.Error("participant error on a command", "command_id", v.cmd.CommandID, "error", err)
		return k.finishDeadLetter(ctx, rec, ReasonEngineError, "participant error: "+err.Error())
	}
	if err != nil {
		return err
	}
	if err := k.publishReply(ctx, row); err != nil {
		if !errors.Is(err, kerr.MessageTooLarge) {
			return err
		}
		// The stored reply can never be sent; the saga's step times out.
		k.log.Error("the reply is too large for Kafka; it is stored but never sent",
			"command_id", v.cmd.CommandID, "bytes", len(row.value))
	}
	if v.kind == verdictAnswer && v.reason != "" {
		return k.finishDeadLetter(ctx, rec, v.reason, v.detail)
	}
	return nil
}

// resolveRecord resolves a record by reference (blobs.resolve), waiting out
// an unreachable blob store; it returns a *blobError for a reference that
// cannot be resolved, or ctx's error.
func (k *Kit) resolveRecord(ctx context.Context, rec *Record) (*Record, error) {
	if k.blobs == nil {
		return rec, nil
	}
	for retry := 0; ; retry++ {
		out, err := k.blobs.resolve(ctx, rec)
		var be *blobError
		if err == nil || errors.As(err, &be) {
			return out, err
		}
		k.log.Warn("blob store unavailable; waiting", "offset", rec.Offset, "error", err)
		if !sleep(ctx, paceOutage.delay(retry+1)) {
			return nil, ctx.Err()
		}
	}
}

// finishDeadLetter dead-letters rec; a record too large even when truncated
// is logged and given up, rather than stalling its partition.
func (k *Kit) finishDeadLetter(ctx context.Context, rec *Record, reason, detail string) error {
	err := k.deadLetter(ctx, rec, reason, detail)
	if errors.Is(err, kerr.MessageTooLarge) {
		k.log.Error("could not dead-letter a record even truncated", "reason", reason,
			"partition", rec.Partition, "offset", rec.Offset, "error", err)
		return nil
	}
	return err
}
