package kit

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func applyNothing(context.Context, pgx.Tx, Command) (any, error) { return nil, nil }

// Which passes the kit claims by their outcome's insert alone (optimistic)
// and which go the locked way.
func TestOptimisticRule(t *testing.T) {
	inTx := &handler{fn: applyNothing}
	outside := &handler{fn: applyNothing, effects: EffectsOutside}
	forward := &Command{CommandID: "saga-1:book:0"}
	for _, c := range []struct {
		name    string
		cmd     *Command
		h       *handler
		attempt int
		want    bool
	}{
		{"a handler whose effects are in its transaction", forward, inTx, 1, true},
		{"a command answered by a failed check (no handler)", forward, nil, 1, true},
		{"a handler acting outside its transaction", forward, outside, 1, false},
		{"a compensation", &Command{CommandID: "saga-1:undo:0", Compensation: true, Compensates: []string{"saga-1:book:0"}}, inTx, 1, false},
		{"a command naming forward ids to tombstone", &Command{CommandID: "saga-1:undo:0", Compensates: []string{"saga-1:book:0"}}, inTx, 1, false},
		{"a compensation with nothing to tombstone", &Command{CommandID: "saga-1:undo:0", Compensation: true}, inTx, 1, false},
		{"a retry after the handler failed", forward, inTx, 2, false},
	} {
		if got := optimistic(c.cmd, c.h, c.attempt); got != c.want {
			t.Errorf("%s: optimistic = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestEffectsOption(t *testing.T) {
	k := &Kit{handlers: map[string]*handler{}}
	k.Handle("Book", applyNothing)
	HandleTyped(k, "Call", func(context.Context, pgx.Tx, Command, struct{}) (any, error) { return nil, nil }, WithEffects(EffectsOutside))
	if k.handlers["Book"].effects != EffectsTransaction || k.handlers["Call"].effects != EffectsOutside || k.handlers["Call"].validate == nil {
		t.Errorf("effects: Book %v, Call %v", k.handlers["Book"].effects, k.handlers["Call"].effects)
	}
	defer func() {
		msg, _ := recover().(string)
		if !strings.Contains(msg, `Handle("Mail"): WithEffects(Effects(7))`) || !strings.Contains(msg, "kit.EffectsOutside") {
			t.Errorf("a bad Effects: %q", msg)
		}
	}()
	k.Handle("Mail", applyNothing, WithEffects(Effects(7)))
}

// A handler's tx is neither committed nor rolled back by the handler.
func TestHandlerTxRefusesToEnd(t *testing.T) {
	var tx handlerTx
	if tx.Commit(context.Background()) == nil || tx.Rollback(context.Background()) == nil {
		t.Error("a handler ended the kit's transaction")
	}
}
