package kit

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// participantEnv, set, makes this test binary the harness's participant as a
// process of its own (runTestParticipant), for a test to kill.
const participantEnv = "GOKIT_TEST_PARTICIPANT"

func TestMain(m *testing.M) {
	if os.Getenv(participantEnv) != "" {
		os.Exit(runTestParticipant())
	}
	os.Exit(m.Run())
}

// runTestParticipant runs the participant "p" with Apply and Undo on the
// harness's servers, topic prefix, schema and instance id (GOKIT_TEST_PREFIX,
// GOKIT_TEST_SCHEMA, GOKIT_TEST_INSTANCE), and the crash hook SAGA_CRASH_AT
// names, until SIGTERM.
func runTestParticipant() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	hook, err := CrashAt(os.Getenv("SAGA_CRASH_AT"))
	if err != nil {
		log.Error("SAGA_CRASH_AT", "error", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("SAGA_TEST_PG_DSN"))
	if err != nil {
		log.Error("pool", "error", err)
		return 2
	}
	defer pool.Close()
	schema := os.Getenv("GOKIT_TEST_SCHEMA")
	k, err := New(Config{
		Name: "p", Brokers: []string{os.Getenv("SAGA_TEST_KAFKA")}, TopicPrefix: os.Getenv("GOKIT_TEST_PREFIX"),
		Partitions: testPartitions, Pool: pool, Schema: schema, InstanceID: os.Getenv("GOKIT_TEST_INSTANCE"),
		Logger: log, CrashHook: hook,
	})
	if err != nil {
		log.Error("kit", "error", err)
		return 2
	}
	registerApplyOn(k, pgx.Identifier{schema, "effects"}.Sanitize())
	if err := k.Run(ctx); err != nil {
		log.Error("run", "error", err)
		return 1
	}
	return 0
}

// The participant killed (SIGKILL) after its optimistic pass inserted the
// command's outcome, before COMMIT: the insert and the handler's write roll
// back with the connection. Started again, it is delivered the command again
// and applies it once.
func TestIntegrationKilledBetweenOptimisticInsertAndCommit(t *testing.T) {
	h := newHarness(t, nil)
	registerApply(h)
	var stderr bytes.Buffer
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), participantEnv+"=1", "GOKIT_TEST_PREFIX="+h.prefix, "GOKIT_TEST_SCHEMA="+h.schema,
		"GOKIT_TEST_INSTANCE="+h.kit.Config().InstanceID, "SAGA_CRASH_AT="+CrashAfterOptimisticInsert)
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = child.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = child.Process.Kill() // by its pid; a no-op once it exited
		<-exited
	})
	h.send(h.command("Apply", "saga-kill", "cmd-kill", `{"key":"kill"}`))
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatal("the participant was not killed at its crash point within 60 s")
	}
	ws, _ := child.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL || !strings.Contains(stderr.String(), "crash point after_optimistic_insert reached") {
		t.Fatalf("the participant ended %v: %s", child.ProcessState, stderr.String())
	}
	// Died inside its transaction: all of it rolled back.
	for _, table := range []string{h.table("effects"), h.kit.store.processed, h.kit.store.outbox} {
		if n := h.count(`SELECT count(*) FROM ` + table); n != 0 {
			t.Errorf("%d rows in %s after the kill", n, table)
		}
	}
	// The same instance back (static membership: its partitions at once).
	h.start()
	r := h.await("inbox", 1, byCommand("cmd-kill"))[0]
	if outcome, payload, _ := replyOf(t, r); outcome != OutcomeSuccess || payload["applied"] != float64(1) {
		t.Errorf("after the restart: %s", r.Value)
	}
	if n := h.count(`SELECT count(*) FROM ` + h.table("effects")); n != 1 {
		t.Errorf("%d effects of one command", n)
	}
}
