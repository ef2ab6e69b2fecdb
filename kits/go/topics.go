package kit

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// ensureTopic creates topic with the protocol's partitions and replication
// factor and no other configuration (section 1), unless this instance knows
// it exists; "already exists" (error 36) is success. It waits out an
// unreachable Kafka, returning an error only when ctx ends.
func (k *Kit) ensureTopic(ctx context.Context, topic string) error {
	k.topicsMu.Lock()
	known := k.topics[topic]
	k.topicsMu.Unlock()
	if known {
		return nil
	}
	adm := kadm.NewClient(k.producer)
	for retry := 0; ; retry++ {
		err := createTopic(ctx, adm, topic, k.cfg.Partitions, k.cfg.ReplicationFactor)
		if err == nil {
			k.topicsMu.Lock()
			k.topics[topic] = true
			k.topicsMu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Not allowed to create topics, say: enough if it exists already.
		if listed, lerr := adm.ListTopics(ctx, topic); lerr == nil && listed.Has(topic) && listed[topic].Err == nil {
			k.topicsMu.Lock()
			k.topics[topic] = true
			k.topicsMu.Unlock()
			return nil
		}
		k.log.Warn("could not create a topic; retrying", "topic", topic, "error", err)
		if !sleep(ctx, paceOutage.delay(retry+1)) {
			return ctx.Err()
		}
	}
}

func createTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int32, rf int16) error {
	resp, err := adm.CreateTopics(ctx, partitions, rf, nil, topic)
	if err != nil {
		return err
	}
	r, ok := resp[topic]
	if !ok {
		return fmt.Errorf("no answer for topic %s", topic)
	}
	if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
		return r.Err
	}
	return nil
}
