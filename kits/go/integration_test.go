package kit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type keyCmd struct {
	Key string `json:"key"`
}

// registerApply registers Apply (records one effect, answers the count) and
// Undo (removes them, answers how many), and returns how often Apply ran.
func registerApply(h *harness) *atomic.Int64 {
	return registerApplyOn(h.kit, h.table("effects"))
}

// registerApplyOn registers Apply and Undo on k, their effects in table.
func registerApplyOn(k *Kit, table string) *atomic.Int64 {
	var calls atomic.Int64
	HandleTyped(k, "Apply", func(ctx context.Context, tx pgx.Tx, cmd Command, b keyCmd) (any, error) {
		calls.Add(1)
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (key) VALUES ($1)`, b.Key); err != nil {
			return nil, err
		}
		var n int64
		err := tx.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE key = $1`, b.Key).Scan(&n)
		return map[string]any{"key": b.Key, "applied": n}, err
	})
	HandleTyped(k, "Undo", func(ctx context.Context, tx pgx.Tx, cmd Command, b keyCmd) (any, error) {
		tag, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE key = $1`, b.Key)
		return map[string]any{"undone": tag.RowsAffected(), "forward_applied": cmd.ForwardApplied}, err
	})
	return &calls
}

// Sections 7.2, 7.4 and 10: three copies of one command id are applied once
// and each is answered with the stored reply, its headers answering that copy.
func TestIntegrationDuplicatesAppliedOnce(t *testing.T) {
	h := newHarness(t, nil)
	calls := registerApply(h)
	h.start()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	var ids []string
	for range 3 {
		rec := h.command("Apply", "saga-dup", "cmd-dup", `{"key":"dup"}`, Header{hTraceparent, []byte(tp)})
		ids = append(ids, header(rec, hID))
		h.send(rec)
	}
	replies := h.await("inbox", 3, byCommand("cmd-dup"))
	// Counted in the participant's table: a copy may run the handler on its
	// optimistic pass, in a transaction rolled back.
	if n := h.count(`SELECT count(*) FROM ` + h.table("effects")); n != 1 || calls.Load() < 1 {
		t.Fatalf("applied %d times (the handler ran %d times)", n, calls.Load())
	}
	wantPartition := recordPartitioner().ForTopic("").Partition(&kgo.Record{Key: []byte("saga-dup")}, testPartitions)
	for i, r := range replies {
		if string(r.Value) != string(replies[0].Value) {
			t.Errorf("copy %d answered %s, the first %s", i, r.Value, replies[0].Value)
		}
		if outcome, payload, _ := replyOf(t, r); outcome != OutcomeSuccess || payload["applied"] != float64(1) {
			t.Errorf("reply %s", r.Value)
		}
		if header(r, hCausationID) != ids[i] || string(r.Key) != "saga-dup" || int(r.Partition) != wantPartition {
			t.Errorf("reply %d: causation %s key %s partition %d", i, header(r, hCausationID), r.Key, r.Partition)
		}
		for name, want := range map[string]string{hType: "saga.reply", hSource: "/participants/p", hSagaID: "saga-dup",
			hCorrelationID: "saga-dup", hSchemaVersion: "1", hSpecVersion: "1.0", hContentType: "application/json"} {
			if header(r, name) != want {
				t.Errorf("reply %d: %s = %q, want %q", i, name, header(r, name), want)
			}
		}
		if got := header(r, hTraceparent); !strings.HasPrefix(got, "00-4bf92f3577b34da6a3ce929d0e0e4736-") || strings.Contains(got, "00f067aa0ba902b7") {
			t.Errorf("reply %d: traceparent %q does not continue the trace in a span of its own", i, got)
		}
	}
	if h.count(`SELECT count(*) FROM `+h.kit.store.outbox+` WHERE published_at IS NULL`) != 0 {
		t.Errorf("an outbox row is left unpublished")
	}
}

// Sections 7.2 step 5 and 7.3: a refusal rolls back to the savepoint and is a
// stored failure; an unexpected error is retried, then a stored retryable.
func TestIntegrationRefusalAndRetryable(t *testing.T) {
	h := newHarness(t, nil)
	var boom, refusals atomic.Int64
	h.kit.Handle("Refuse", func(ctx context.Context, tx pgx.Tx, cmd Command) (any, error) {
		refusals.Add(1)
		if _, err := tx.Exec(ctx, `INSERT INTO `+h.table("effects")+` (key) VALUES ('refused')`); err != nil {
			return nil, err
		}
		return nil, Reject("out of stock", map[string]any{"sku": "A-1"})
	})
	h.kit.Handle("Boom", func(ctx context.Context, tx pgx.Tx, cmd Command) (any, error) {
		boom.Add(1)
		if _, err := tx.Exec(ctx, `INSERT INTO `+h.table("effects")+` (key) VALUES ('boom')`); err != nil {
			return nil, err
		}
		return nil, errors.New("inventory database unavailable")
	})
	h.start()
	h.send(h.command("Refuse", "saga-r", "cmd-refuse", `{}`), h.command("Boom", "saga-b", "cmd-boom", `{}`))
	r := h.await("inbox", 1, byCommand("cmd-refuse"))[0]
	if outcome, payload, msg := replyOf(t, r); outcome != OutcomeFailure || msg != "out of stock" || payload["sku"] != "A-1" {
		t.Errorf("refusal answered %s", r.Value)
	}
	// Refused on the optimistic pass (no savepoint): the whole transaction
	// rolled back, the refusal recorded on the locked way as it was given,
	// without asking the handler again.
	if refusals.Load() != 1 {
		t.Errorf("the refusing handler ran %d times", refusals.Load())
	}
	r = h.await("inbox", 1, byCommand("cmd-boom"))[0]
	if outcome, _, msg := replyOf(t, r); outcome != OutcomeRetryable || !strings.Contains(msg, "inventory database unavailable") {
		t.Errorf("failing handler answered %s", r.Value)
	}
	if boom.Load() != 2 {
		t.Errorf("the handler ran %d times, want HandlerAttempts = 2", boom.Load())
	}
	h.send(h.command("Boom", "saga-b", "cmd-boom", `{}`))
	again := h.await("inbox", 2, byCommand("cmd-boom"))
	// The copy's optimistic pass ran the handler once more (it failed, and
	// the command's outcome was found stored): answered from the store.
	if string(again[1].Value) != string(r.Value) || boom.Load() != 3 {
		t.Errorf("a copy of a retryable command was not answered from the store: %s, %d runs", again[1].Value, boom.Load())
	}
	if n := h.count(`SELECT count(*) FROM ` + h.table("effects")); n != 0 {
		t.Errorf("%d effects of refused or failed commands remain", n)
	}
}

// Section 7.2 step 3a and 7.3: a compensation first tombstones its forward
// command, which is then answered failure and never applied.
func TestIntegrationCompensationTombstones(t *testing.T) {
	h := newHarness(t, nil)
	registerApply(h)
	h.start()
	comp := func(id, forward string) *kgo.Record {
		return h.command("Undo", "saga-c", id, `{"key":"c"}`, Header{hCompensation, []byte("true")}, Header{hCompensates, []byte(forward)})
	}
	h.send(comp("undo-1", "fwd-1"))
	r := h.await("inbox", 1, byCommand("undo-1"))[0]
	if outcome, payload, _ := replyOf(t, r); outcome != OutcomeSuccess || payload["undone"] != float64(0) || payload["forward_applied"] != false {
		t.Errorf("early compensation answered %s", r.Value)
	}
	h.send(h.command("Apply", "saga-c", "fwd-1", `{"key":"c"}`))
	r = h.await("inbox", 1, byCommand("fwd-1"))[0]
	applied := h.count(`SELECT count(*) FROM ` + h.table("effects") + ` WHERE key = 'c'`)
	if outcome, _, msg := replyOf(t, r); outcome != OutcomeFailure || msg != tombstoneError || applied != 0 {
		t.Errorf("forward after its compensation answered %s (applied %d times)", r.Value, applied)
	}
	h.send(h.command("Apply", "saga-c", "fwd-2", `{"key":"c"}`))
	h.await("inbox", 1, byCommand("fwd-2"))
	h.send(comp("undo-2", "fwd-x,fwd-2"))
	r = h.await("inbox", 1, byCommand("undo-2"))[0]
	if _, payload, _ := replyOf(t, r); payload["undone"] != float64(1) || payload["forward_applied"] != true {
		t.Errorf("compensation after its forward answered %s", r.Value)
	}
}

// Sections 7.5, 11 and 12: dead letters carry every dlq_* header; a record too
// large even for the dead-letter topic is truncated; checks 16 and 18 are
// answered and dead-lettered.
func TestIntegrationDeadLetters(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxMessageBytes = 100_000 })
	registerApply(h)
	h.start()
	bad := h.command("Apply", "saga-d", "dlq-json", `{"key":`)
	mid := h.command("Apply", "saga-d", "dlq-mid", `{"key":"`+strings.Repeat("m", 150_000)+`"}`)
	big := h.command("Apply", "saga-d", "dlq-big", `{"key":"`+strings.Repeat("b", 300_000)+`"}`)
	nul := h.command("Apply", "saga-d", "dlq-nul", `{"key":"\u0000"}`)
	arr := h.command("Apply", "saga-d", "dlq-arr", `[]`)
	h.send(bad, mid, big, nul, arr)
	for id, reason := range map[string]string{"dlq-json": ReasonMalformedJSON, "dlq-mid": ReasonOversized,
		"dlq-big": ReasonOversized, "dlq-nul": ReasonUnstorableValue, "dlq-arr": ReasonInvalidBody} {
		d := h.await("dlq", 1, byCommand(id))[0]
		if header(d, "dlq_reason") != reason || header(d, "dlq_topic") != h.prefix+".cmd.p" ||
			header(d, "dlq_consumer") != h.kit.DeadLetterConsumer() || !strings.HasPrefix(header(d, "dlq_consumer"), "participant:p:") ||
			header(d, "dlq_detail") == "" || header(d, "dlq_partition") == "" || header(d, "dlq_offset") == "" ||
			string(d.Key) != "saga-d" {
			t.Errorf("%s: dead letter headers %v", id, d.Headers)
		}
		if _, err := strconv.Atoi(header(d, "dlq_offset")); err != nil {
			t.Errorf("%s: dlq_offset %q", id, header(d, "dlq_offset"))
		}
	}
	if d := h.await("dlq", 1, byCommand("dlq-mid"))[0]; len(d.Value) != len(mid.Value) || header(d, "dlq_truncated") != "" {
		t.Errorf("a record that fits the dead-letter topic was truncated")
	}
	if d := h.await("dlq", 1, byCommand("dlq-big"))[0]; len(d.Value) != 65536 || header(d, "dlq_truncated") != strconv.Itoa(len(big.Value)) {
		t.Errorf("truncated dead letter: %d bytes, dlq_truncated %q", len(d.Value), header(d, "dlq_truncated"))
	}
	for _, id := range []string{"dlq-nul", "dlq-arr"} {
		if outcome, _, _ := replyOf(t, h.await("inbox", 1, byCommand(id))[0]); outcome != OutcomeFailure {
			t.Errorf("%s answered %s", id, outcome)
		}
	}
	time.Sleep(time.Second)
	for _, id := range []string{"dlq-json", "dlq-mid", "dlq-big"} {
		if n := len(h.await("inbox", 0, byCommand(id))); n != 0 {
			t.Errorf("%s was answered", id)
		}
	}
}

// Section 7.2 step 7: rows left unpublished (a crash after the commit) are
// published on start. Section 1: a reply topic that does not exist is created.
func TestIntegrationOutboxRelayAndReplyTopic(t *testing.T) {
	h := newHarness(t, nil)
	registerApply(h)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.kit.store.migrate(ctx); err != nil {
		t.Fatal(err)
	}
	h.exec(`INSERT INTO `+h.kit.store.outbox+` (command_id, topic, key, header_names, header_values, value)
		VALUES ('left-over', $1, 'saga-o', ARRAY['ce_commandid'], ARRAY['left-over'::bytea], '{"outcome":"success","payload":{}}')`,
		h.prefix+".inbox")
	h.start()
	h.await("inbox", 1, byCommand("left-over"))
	h.send(h.command("Apply", "saga-o", "to-other", `{"key":"o"}`, Header{hReplyTo, []byte(h.prefix + ".other")}))
	h.await("other", 1, byCommand("to-other"))
}

// Run returns after the batch in hand is done, with its offsets committed.
func TestIntegrationGracefulShutdown(t *testing.T) {
	h := newHarness(t, nil)
	started := make(chan struct{})
	var once atomic.Bool
	h.kit.Handle("Slow", func(ctx context.Context, tx pgx.Tx, cmd Command) (any, error) {
		if once.CompareAndSwap(false, true) {
			close(started)
		}
		time.Sleep(2 * time.Second)
		return map[string]any{"slow": true}, nil
	})
	h.start()
	h.send(h.command("Slow", "saga-s", "slow-1", `{}`))
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never ran")
	}
	begun := time.Now()
	h.stop()
	if time.Since(begun) > 15*time.Second {
		t.Errorf("Run took %s to return", time.Since(begun))
	}
	if outcome, _, _ := replyOf(t, h.await("inbox", 1, byCommand("slow-1"))[0]); outcome != OutcomeSuccess {
		t.Errorf("the batch in hand was not finished")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	adm := kadm.NewClient(h.client)
	committed, err := adm.FetchOffsets(ctx, h.prefix+".participant.p")
	if err != nil {
		t.Fatal(err)
	}
	ends, err := adm.ListEndOffsets(ctx, h.prefix+".cmd.p")
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset == 0 {
			return
		}
		c, ok := committed.Lookup(o.Topic, o.Partition)
		if !ok || c.At != o.Offset {
			t.Errorf("partition %d: committed %v, end %d", o.Partition, c.At, o.Offset)
		}
	})
}
