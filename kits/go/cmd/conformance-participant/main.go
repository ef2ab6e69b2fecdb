// Command conformance-participant is the participant that `saga conformance`
// checks (PROTOCOL.md section 16), built with the Go kit. It handles
// ConformanceApply, ConformanceRefuse and ConformanceUndo, keeping its effects
// in a table of its own.
//
// Configuration, from the environment:
//
//	SAGA_KAFKA__BOOTSTRAP_SERVERS   Kafka brokers, comma-separated (required)
//	SAGA_PG__DSN                    Postgres DSN (required)
//	SAGA_KAFKA__TOPIC_PREFIX        topic prefix (default saga)
//	SAGA_KAFKA__PARTITIONS          partitions of the topics it creates (default 8)
//	SAGA_KAFKA__MAX_MESSAGE_BYTES   message size limit (default 1000000)
//	SAGA_PARTICIPANT__NAME          participant name (default conformance-go)
//	SAGA_PARTICIPANT__SCHEMA        Postgres schema (default saga_go_conformance)
//	SAGA_PARTICIPANT__INSTANCE_ID   group.instance.id (default: the kit's)
//	SAGA_CRASH_AT                   crash points, point[:count],... (kit.CrashAt;
//	                                fault-injection tests only)
//
// Commands and replies by reference (docs/large-payloads.md), when
// SAGA_CODEC__BLOBS__THRESHOLD_BYTES is set, as the engine's settings say:
//
//	SAGA_CODEC__BLOBS__MAC_KEYS        {"key id": "base64 key", ...}
//	SAGA_CODEC__BLOBS__CURRENT_MAC_KEY the key id replies are signed with
//	SAGA_CODEC__BLOBS__MAC_KEY         the unnamed key (base64)
//	SAGA_CODEC__BLOBS__DIRECTORY       the directory store's volume
//	SAGA_CODEC__BLOBS__MAX_BYTES       the largest blob (default 64 MiB)
//	SAGA_PG__DB_SCHEMA                 the engine's schema (default saga_engine)
//
// It also handles ConformanceEcho, which answers {"text": its body's text
// reversed}: a large text goes both ways by reference.
//
// It stops on SIGINT or SIGTERM after finishing the batch in hand.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	kit "github.com/saga-engine/saga-engine/kits/go"
)

// keyBody is the body of ConformanceRefuse and ConformanceUndo.
type keyBody struct {
	Key string `json:"key"`
}

// applyBody is the body of ConformanceApply: an optional integer that may be
// anything from -2^63 to 2^64-1 (section 12), which the handler ignores.
type applyBody struct {
	Key    string       `json:"key"`
	Amount *json.Number `json:"amount"`
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	v, err := strconv.Atoi(env(name, strconv.Itoa(def)))
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	return v
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	brokers, dsn := os.Getenv("SAGA_KAFKA__BOOTSTRAP_SERVERS"), os.Getenv("SAGA_PG__DSN")
	if brokers == "" || dsn == "" {
		fmt.Fprintln(os.Stderr, "set SAGA_KAFKA__BOOTSTRAP_SERVERS and SAGA_PG__DSN")
		os.Exit(2)
	}
	schema := env("SAGA_PARTICIPANT__SCHEMA", "saga_go_conformance")
	tp := sdktrace.NewTracerProvider() // real span ids; no exporter
	defer func() { _ = tp.Shutdown(context.Background()) }()

	blobs, err := blobConfig(dsn)
	if err != nil {
		log.Error("configuration", "error", err)
		os.Exit(2)
	}
	crash, err := kit.CrashAt(os.Getenv("SAGA_CRASH_AT"))
	if err != nil {
		log.Error("configuration: SAGA_CRASH_AT", "error", err)
		os.Exit(2)
	}
	k, err := kit.New(kit.Config{
		Name:            env("SAGA_PARTICIPANT__NAME", "conformance-go"),
		Brokers:         strings.Split(brokers, ","),
		TopicPrefix:     env("SAGA_KAFKA__TOPIC_PREFIX", "saga"),
		Partitions:      int32(envInt("SAGA_KAFKA__PARTITIONS", 8)),
		MaxMessageBytes: envInt("SAGA_KAFKA__MAX_MESSAGE_BYTES", 1_000_000),
		DSN:             dsn,
		Schema:          schema,
		InstanceID:      os.Getenv("SAGA_PARTICIPANT__INSTANCE_ID"),
		Logger:          log,
		TracerProvider:  tp,
		Blobs:           blobs,
		CrashHook:       crash,
	})
	if err != nil {
		log.Error("configuration", "error", err)
		os.Exit(2)
	}
	defer k.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	effects := pgx.Identifier{schema, "conformance_effects"}.Sanitize()
	if err := createEffects(ctx, dsn, schema, effects); err != nil {
		log.Error("create the effects table", "error", err)
		os.Exit(1)
	}

	kit.HandleTyped(k, "ConformanceApply", func(ctx context.Context, tx pgx.Tx, _ kit.Command, b applyBody) (any, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` (key) VALUES ($1)`, b.Key); err != nil {
			return nil, err
		}
		var n int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+effects+` WHERE key = $1`, b.Key).Scan(&n); err != nil {
			return nil, err
		}
		return map[string]any{"key": b.Key, "applied": n}, nil
	})
	kit.HandleTyped(k, "ConformanceRefuse", func(ctx context.Context, tx pgx.Tx, _ kit.Command, b keyBody) (any, error) {
		return nil, kit.Reject("refused: conformance", map[string]any{"key": b.Key})
	})
	kit.HandleTyped(k, "ConformanceUndo", func(ctx context.Context, tx pgx.Tx, _ kit.Command, b keyBody) (any, error) {
		tag, err := tx.Exec(ctx, `DELETE FROM `+effects+` WHERE key = $1`, b.Key)
		if err != nil {
			return nil, err
		}
		return map[string]any{"key": b.Key, "undone": tag.RowsAffected()}, nil
	})

	kit.HandleTyped(k, "ConformanceEcho", func(ctx context.Context, tx pgx.Tx, _ kit.Command, b echoBody) (any, error) {
		runes := []rune(b.Text)
		for i, j := 0, len(runes)-1; i < j; i, j = i+1, j-1 {
			runes[i], runes[j] = runes[j], runes[i]
		}
		return map[string]any{"text": string(runes)}, nil
	})

	if err := k.Run(ctx); err != nil {
		log.Error("run", "error", err)
		os.Exit(1)
	}
}

// echoBody is the body of ConformanceEcho.
type echoBody struct {
	Text string `json:"text"`
}

// blobConfig is the kit's BlobConfig from SAGA_CODEC__BLOBS__*; nil when
// THRESHOLD_BYTES is unset.
func blobConfig(dsn string) (*kit.BlobConfig, error) {
	if os.Getenv("SAGA_CODEC__BLOBS__THRESHOLD_BYTES") == "" {
		return nil, nil
	}
	keys := map[string][]byte{}
	texts := map[string]string{}
	if raw := os.Getenv("SAGA_CODEC__BLOBS__MAC_KEYS"); raw != "" {
		if err := json.Unmarshal([]byte(raw), &texts); err != nil {
			return nil, fmt.Errorf("SAGA_CODEC__BLOBS__MAC_KEYS: %w", err)
		}
	}
	if v := os.Getenv("SAGA_CODEC__BLOBS__MAC_KEY"); v != "" {
		texts[""] = v
	}
	for id, text := range texts {
		key, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			return nil, fmt.Errorf("MAC key %q is not base64: %w", id, err)
		}
		keys[id] = key
	}
	current := os.Getenv("SAGA_CODEC__BLOBS__CURRENT_MAC_KEY")
	if current == "" && len(keys) == 1 {
		for id := range keys {
			current = id
		}
	}
	return &kit.BlobConfig{
		DSN:        dsn,
		Schema:     env("SAGA_PG__DB_SCHEMA", "saga_engine"),
		Directory:  os.Getenv("SAGA_CODEC__BLOBS__DIRECTORY"),
		MACKeys:    keys,
		CurrentKey: current,
		Threshold:  envInt("SAGA_CODEC__BLOBS__THRESHOLD_BYTES", 0),
		MaxBytes:   envInt("SAGA_CODEC__BLOBS__MAX_BYTES", 0),
	}, nil
}

func createEffects(ctx context.Context, dsn, schema, table string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
		id bigserial PRIMARY KEY,
		key text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`)
	return err
}
