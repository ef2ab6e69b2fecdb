package kit

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
)

// The optimistic claim on the real Postgres and Kafka: a handler whose every
// effect is a write in its transaction (the default) is claimed by its
// outcome's insert alone. Effects are counted in the participant's own table,
// never in memory; the handler's calls are counted only to show which way a
// command went (a copy's handler runs on the optimistic pass, in a
// transaction rolled back).

// A copy sent again after the first was answered runs its handler in a
// transaction that is rolled back when its outcome's insert finds the stored
// row, and is answered from the stored reply: one effect, the same reply.
func TestIntegrationOptimisticResentCopy(t *testing.T) {
	h := newHarness(t, nil)
	calls := registerApply(h)
	h.start()
	h.send(h.command("Apply", "saga-re", "cmd-re", `{"key":"re"}`))
	first := h.await("inbox", 1, byCommand("cmd-re"))[0]
	h.send(h.command("Apply", "saga-re", "cmd-re", `{"key":"re"}`))
	replies := h.await("inbox", 2, byCommand("cmd-re"))
	if string(replies[1].Value) != string(first.Value) {
		t.Errorf("the copy was answered %s, the first %s", replies[1].Value, first.Value)
	}
	if n := h.count(`SELECT count(*) FROM ` + h.table("effects") + ` WHERE key = 're'`); n != 1 {
		t.Errorf("%d effects of one command", n)
	}
	// The copy ran its handler on the optimistic pass (the locked way would
	// have found the stored reply before it), and that pass lost its claim.
	if calls.Load() != 2 || h.kit.ClaimsLost() != 1 {
		t.Errorf("the handler ran %d times, %d claims lost: the copy did not go the optimistic way", calls.Load(), h.kit.ClaimsLost())
	}
	if n := h.count(`SELECT count(*) FROM ` + h.kit.store.outbox + ` WHERE command_id = 'cmd-re'`); n != 1 {
		t.Errorf("%d outbox rows for one command", n)
	}
}

// Two instances (in two consumer groups, as a copy on another instance after
// a rebalance) take the same command at the same moment: both run the
// handler, both insert the outcome; the second insert waits for the first
// transaction, finds the row, rolls back (its effect with it) and answers
// with the stored reply.
func TestIntegrationOptimisticTwoInstancesRaceOneCommand(t *testing.T) {
	h := newHarness(t, nil)
	twin := h.twin("twin")
	var entered atomic.Int64
	both := make(chan struct{})
	register := func(k *Kit, instance string) {
		HandleTyped(k, "Book", func(ctx context.Context, tx pgx.Tx, cmd Command, b keyCmd) (any, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO `+h.table("effects")+` (key) VALUES ($1)`, b.Key); err != nil {
				return nil, err
			}
			if entered.Add(1) == 2 {
				close(both)
			}
			// Both wait here with their write done, uncommitted, until both
			// are in (the locked way lets only one in: it goes on after 10 s).
			select {
			case <-both:
			case <-time.After(10 * time.Second):
			}
			return map[string]any{"by": instance}, nil
		})
	}
	register(h.kit, "one")
	register(twin, "two")
	h.start()
	h.run(twin)
	h.send(h.command("Book", "saga-race", "cmd-race", `{"key":"race"}`))
	replies := h.await("inbox", 2, byCommand("cmd-race"))
	if entered.Load() != 2 {
		t.Errorf("%d instances ran the handler: the second was held before it, not claimed by its insert", entered.Load())
	}
	if string(replies[0].Value) != string(replies[1].Value) {
		t.Errorf("the instances answered %s and %s", replies[0].Value, replies[1].Value)
	}
	if outcome, payload, _ := replyOf(t, replies[0]); outcome != OutcomeSuccess || payload["by"] == nil {
		t.Errorf("answered %s", replies[0].Value)
	}
	if n := h.count(`SELECT count(*) FROM ` + h.table("effects")); n != 1 {
		t.Errorf("%d effects of one command", n)
	}
	if lost := h.kit.ClaimsLost() + twin.ClaimsLost(); lost != 1 {
		t.Errorf("%d claims lost, want 1", lost)
	}
	if n := h.count(`SELECT count(*) FROM ` + h.kit.store.processed + ` WHERE command_id = 'cmd-race'`); n != 1 {
		t.Errorf("%d stored outcomes", n)
	}
}

// A forward command arriving after its compensation runs its handler on the
// optimistic pass; its insert meets the tombstone, its effect is rolled back,
// and it is answered with the tombstone's failure.
func TestIntegrationOptimisticLateForwardMeetsTombstone(t *testing.T) {
	h := newHarness(t, nil)
	calls := registerApply(h)
	h.start()
	h.send(h.command("Undo", "saga-late", "undo-late", `{"key":"late"}`,
		Header{hCompensation, []byte("true")}, Header{hCompensates, []byte("fwd-late")}))
	h.await("inbox", 1, byCommand("undo-late"))
	h.send(h.command("Apply", "saga-late", "fwd-late", `{"key":"late"}`))
	r := h.await("inbox", 1, byCommand("fwd-late"))[0]
	if outcome, payload, msg := replyOf(t, r); outcome != OutcomeFailure || msg != tombstoneError || payload["compensated_by"] != "undo-late" {
		t.Errorf("the late forward command answered %s", r.Value)
	}
	if n := h.count(`SELECT count(*) FROM ` + h.table("effects") + ` WHERE key = 'late'`); n != 0 {
		t.Errorf("%d effects of a command compensated before it arrived", n)
	}
	if calls.Load() != 1 || h.kit.ClaimsLost() != 1 {
		t.Errorf("the handler ran %d times, %d claims lost: the forward command did not go the optimistic way", calls.Load(), h.kit.ClaimsLost())
	}
}

// A handler registered WithEffects(EffectsOutside) goes the locked way: a
// copy is answered from the stored reply without running it.
func TestIntegrationEffectsOutsideTakesTheLock(t *testing.T) {
	h := newHarness(t, nil)
	var calls atomic.Int64
	h.kit.Handle("Mail", func(ctx context.Context, tx pgx.Tx, cmd Command) (any, error) {
		calls.Add(1)
		return map[string]any{"mailed": true}, nil
	}, WithEffects(EffectsOutside))
	h.start()
	h.send(h.command("Mail", "saga-mail", "cmd-mail", `{}`))
	h.await("inbox", 1, byCommand("cmd-mail"))
	h.send(h.command("Mail", "saga-mail", "cmd-mail", `{}`))
	replies := h.await("inbox", 2, byCommand("cmd-mail"))
	if string(replies[0].Value) != string(replies[1].Value) || calls.Load() != 1 || h.kit.ClaimsLost() != 0 {
		t.Errorf("the copy of an outside-effects command: %s, the handler ran %d times, %d claims lost", replies[1].Value, calls.Load(), h.kit.ClaimsLost())
	}
}

// The statements the kit sends per command, counted by a tracer on its pool.
// Optimistic: BEGIN, the handler's own, the outcome's insert (the claim and
// the outbox row in one statement), COMMIT, then the outbox row marked
// published. Locked (the same handler, WithEffects(EffectsOutside)): BEGIN,
// the claim, SAVEPOINT, the handler's own, RELEASE, the reply stored with its
// outbox row, COMMIT, the outbox row marked published.
func TestIntegrationStatementsPerCommand(t *testing.T) {
	h := newHarness(t, nil)
	table := h.table("effects")
	apply := func(ctx context.Context, tx pgx.Tx, cmd Command, b keyCmd) (any, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (key) VALUES ($1)`, b.Key); err != nil {
			return nil, err
		}
		var n int64
		err := tx.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE key = $1`, b.Key).Scan(&n)
		return map[string]any{"applied": n}, err
	}
	HandleTyped(h.kit, "Apply", apply)
	HandleTyped(h.kit, "Call", apply, WithEffects(EffectsOutside))
	h.start()
	sent := int64(0)
	perCommand := func(typ string) (int, string) {
		// A warm-up: the pool's connections open, the kit's statements prepared.
		const n = 10
		for i := range n + 1 {
			if i == 1 {
				h.eventually("the warm-up's reply marked published", h.published(sent+1))
				h.statements.start()
			}
			id := fmt.Sprintf("%s-%d", typ, i)
			h.send(h.command(typ, "saga-"+id, id, `{"key":"rt"}`))
			h.await("inbox", 1, byCommand(id))
		}
		sent += n + 1
		h.eventually("every reply marked published", h.published(sent))
		sql := h.statements.stop()
		t.Logf("%s: %d statements for %d commands: %s", typ, len(sql), n, statementKinds(sql))
		if len(sql)%n != 0 {
			t.Errorf("%s: %d statements for %d commands: %s", typ, len(sql), n, statementKinds(sql))
		}
		return len(sql) / n, statementKinds(sql)
	}
	// Apply's two, BEGIN, the outcome's insert, COMMIT; the mark published.
	if got, kinds := perCommand("Apply"); got != 2+3+1 {
		t.Errorf("optimistic: %d statements per command, want 6: %s", got, kinds)
	}
	// Call's two, BEGIN, the claim, SAVEPOINT, RELEASE, the reply stored,
	// COMMIT; the mark published.
	if got, kinds := perCommand("Call"); got != 2+6+1 {
		t.Errorf("locked: %d statements per command, want 9: %s", got, kinds)
	}
}

// published reports whether n outbox rows are marked published.
func (h *harness) published(n int64) func() bool {
	return func() bool {
		return h.count(`SELECT count(*) FROM `+h.kit.store.outbox+` WHERE published_at IS NOT NULL`) == n
	}
}

// twin is a second instance of the harness's participant, in a consumer
// group of its own, so that it gets a copy of every command.
func (h *harness) twin(group string) *Kit {
	h.t.Helper()
	cfg := h.config(h.brokers, h.kitPool(h.dsn, nil), "test-"+group+"-"+randomHex(3))
	cfg.GroupID = h.prefix + ".participant." + h.name + "." + group
	k, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = kadm.NewClient(h.client).DeleteGroup(ctx, cfg.GroupID)
	})
	return k
}

// run runs another kit of the harness until the test ends.
func (h *harness) run(k *Kit) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				h.t.Errorf("Run: %v", err)
			}
		case <-time.After(40 * time.Second):
			h.t.Errorf("Run did not return within 40 s of its context's cancellation")
		}
	})
}

// statementKinds sums statements by their first words, for a failure message.
func statementKinds(sql []string) string {
	counts := map[string]int{}
	for _, s := range sql {
		f := strings.Fields(s)
		key := strings.Join(f[:min(len(f), 3)], " ")
		counts[key]++
	}
	var out []string
	for k, n := range counts {
		out = append(out, fmt.Sprintf("%d× %s", n, k))
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}
