// Command progress-participant is a participant, built with the Go kit, whose
// handler reports its progress (Command.Progress, PROTOCOL.md section 5b)
// while it works: the suite's end-to-end test of step reports runs it against
// an engine and reads the reports from the engine's admin API.
//
// It handles Pack ({"items": n}): every 50 ms it reports {"packed", "of"},
// until a file named after the saga id appears in PROGRESS_RELEASE_DIR (the
// test's signal that it saw the reports), then answers {"boxes": n}.
//
// Configuration, from the environment: SAGA_KAFKA__BOOTSTRAP_SERVERS,
// SAGA_PG__DSN (required), SAGA_KAFKA__TOPIC_PREFIX, SAGA_KAFKA__PARTITIONS,
// SAGA_PARTICIPANT__NAME (default warehouse), SAGA_PARTICIPANT__SCHEMA,
// PROGRESS_RELEASE_DIR (required). It stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	kit "github.com/saga-engine/saga-engine/kits/go"
)

type pack struct {
	Items int `json:"items"`
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	brokers, dsn, dir := os.Getenv("SAGA_KAFKA__BOOTSTRAP_SERVERS"), os.Getenv("SAGA_PG__DSN"), os.Getenv("PROGRESS_RELEASE_DIR")
	if brokers == "" || dsn == "" || dir == "" {
		fmt.Fprintln(os.Stderr, "set SAGA_KAFKA__BOOTSTRAP_SERVERS, SAGA_PG__DSN and PROGRESS_RELEASE_DIR")
		os.Exit(2)
	}
	partitions, err := strconv.Atoi(env("SAGA_KAFKA__PARTITIONS", "8"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "SAGA_KAFKA__PARTITIONS:", err)
		os.Exit(2)
	}
	k, err := kit.New(kit.Config{
		Name:        env("SAGA_PARTICIPANT__NAME", "warehouse"),
		Brokers:     strings.Split(brokers, ","),
		TopicPrefix: env("SAGA_KAFKA__TOPIC_PREFIX", "saga"),
		Partitions:  int32(partitions),
		DSN:         dsn,
		Schema:      env("SAGA_PARTICIPANT__SCHEMA", "saga_go_progress"),
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer k.Close()

	kit.HandleTyped(k, "Pack", func(ctx context.Context, tx pgx.Tx, cmd kit.Command, b pack) (any, error) {
		for done := 1; ; done++ {
			cmd.Progress(map[string]any{"packed": min(done, b.Items), "of": b.Items})
			if _, err := os.Stat(filepath.Join(dir, cmd.SagaID)); err == nil {
				return map[string]any{"boxes": b.Items}, nil
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := k.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
