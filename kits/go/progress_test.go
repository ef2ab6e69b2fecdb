package kit

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestProgressValueIsTheRecordOfSection5b(t *testing.T) {
	cmd := &Command{SagaID: "s-1", CommandID: "c-1", Step: "pack"}
	at := time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.FixedZone("x", 3600))
	value, err := progressValue(cmd, 2, 7, map[string]any{"packed": 1}, at)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"saga_id":"s-1","command_id":"c-1","step":"pack","attempt":2,"seq":7,"at":"2026-01-02T02:04:05.6Z","body":{"packed":1}}`
	if string(value) != want {
		t.Fatalf("got %s\nwant %s", value, want)
	}
	if _, err := progressValue(cmd, 1, 1, strings.Repeat("x", ProgressMaxBytes), at); err == nil || !strings.Contains(err.Error(), "over 8192") {
		t.Errorf("an oversized report: %v", err)
	}
	if _, err := progressValue(cmd, 1, 1, make(chan int), at); err == nil {
		t.Errorf("a body that is not JSON encoded")
	}
}

type panicky struct{}

func (panicky) MarshalJSON() ([]byte, error) { panic("boom") }

func TestProgressNeverFailsNorPanics(t *testing.T) {
	Command{}.Progress("a command no handler was given: nothing happens")
	k, err := New(Config{Name: "p", Brokers: []string{"127.0.0.1:1"}, DSN: "postgres://127.0.0.1:1/x"})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	cmd := k.withProgress(Command{SagaID: "s", CommandID: "c"}, 1)
	cmd.Progress(make(chan int))              // not JSON
	cmd.Progress(strings.Repeat("x", 10_000)) // too large
	cmd.Progress(panicky{})                   // a MarshalJSON that panics
	cmd.Progress("fine, but the kit is not running")
	if sent, dropped := k.ProgressStats(); sent != 0 || dropped != 4 {
		t.Fatalf("sent %d dropped %d, want 0 and 4", sent, dropped)
	}
}

// Section 5b: a handler's reports go to {prefix}.progress keyed by the saga
// id, numbered per run of the handler; reports that cannot be sent are dropped and
// counted, and never fail the handler.
func TestIntegrationProgressReports(t *testing.T) {
	h := newHarness(t, nil)
	attempts := 0
	h.kit.Handle("Work", func(ctx context.Context, tx pgx.Tx, cmd Command) (any, error) {
		attempts++
		cmd.Progress(map[string]any{"done": 1})
		if attempts == 1 {
			cmd.Progress(map[string]any{"done": 2})
			cmd.Progress(strings.Repeat("x", 10_000)) // dropped
			cmd.Progress(make(chan int))              // dropped
			return nil, errors.New("the first attempt fails")
		}
		return map[string]any{"ok": true}, nil
	})
	h.start()
	h.send(h.command("Work", "saga-progress", "cmd-progress", `{}`))
	if outcome, _, _ := replyOf(t, h.await("inbox", 1, byCommand("cmd-progress"))[0]); outcome != OutcomeSuccess {
		t.Fatalf("outcome %s", outcome)
	}
	recs := h.await("progress", 3, func(*kgo.Record) bool { return true })
	type report struct {
		SagaID    string         `json:"saga_id"`
		CommandID string         `json:"command_id"`
		Step      string         `json:"step"`
		Attempt   int            `json:"attempt"`
		Seq       int            `json:"seq"`
		At        time.Time      `json:"at"`
		Body      map[string]any `json:"body"`
	}
	var got []report
	for _, r := range recs {
		var rep report
		if err := json.Unmarshal(r.Value, &rep); err != nil {
			t.Fatalf("%s: %v", r.Value, err)
		}
		if string(r.Key) != "saga-progress" || header(r, "ce_type") != "saga.progress" {
			t.Errorf("key %q ce_type %q", r.Key, header(r, "ce_type"))
		}
		if rep.SagaID != "saga-progress" || rep.CommandID != "cmd-progress" || rep.Step != "step" || rep.At.IsZero() {
			t.Errorf("report %s", r.Value)
		}
		got = append(got, rep)
	}
	// One partition per saga: in the order they were made.
	want := [][3]int{{1, 1, 1}, {1, 2, 2}, {2, 1, 1}}
	for i, rep := range got {
		if [3]int{rep.Attempt, rep.Seq, int(rep.Body["done"].(float64))} != want[i] {
			t.Errorf("report %d: attempt %d seq %d body %v", i, rep.Attempt, rep.Seq, rep.Body)
		}
	}
	if sent, dropped := h.kit.ProgressStats(); sent != 3 || dropped != 2 {
		t.Errorf("sent %d dropped %d, want 3 and 2", sent, dropped)
	}
}
