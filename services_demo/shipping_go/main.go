// Command shipping is the checkout demo's shipping service (port base+5),
// written in Go with the participant kit of kits/go: it schedules shipments
// and prints parcels' labels, and is a participant only.
//
// ScheduleShipment refuses customers outside the delivery area
// (SAGA_DEMO_UNSHIPPABLE, default erin), which is how the demo fails a
// checkout at its last business step; CancelShipment (the compensation) is a
// no-op when nothing was scheduled. PrintLabel prints a parcel's label once
// per order (the fulfilment saga's label node); VoidLabel voids it, a no-op
// when none is printed. HTTP: GET /health, GET /shipments/{order_id} and
// GET /labels/{order_id}, for a look.
//
// Configuration, from the SAGA_* environment the demo gives every service
// (services_demo/run.py):
//
//	SAGA_KAFKA__BOOTSTRAP_SERVERS       Kafka brokers, comma-separated (default 127.0.0.1:19092)
//	SAGA_KAFKA__TOPIC_PREFIX            topic prefix (default saga)
//	SAGA_KAFKA__PARTITIONS              partitions of the topics it creates (default 8)
//	SAGA_KAFKA__REPLICATION_FACTOR      their replication factor (default 1)
//	SAGA_KAFKA__MAX_MESSAGE_BYTES       message size limit (default 1000000)
//	SAGA_KAFKA__SESSION_TIMEOUT_MS      consumer group session timeout (default 6000)
//	SAGA_KAFKA__HEARTBEAT_INTERVAL_MS   heartbeat interval (default 1000)
//	SAGA_KAFKA__GROUP_INSTANCE_ID       group.instance.id (default: the kit's, shipping-{host})
//	SAGA_PARTICIPANT__DSN               Postgres DSN (default SAGA_PG__DSN, then the engine's default)
//	SAGA_PARTICIPANT__DB_SCHEMA         its schema: its table and the kit's (default saga_participant)
//	SAGA_PARTICIPANT__POOL_MAX_SIZE     connections to that database (default 5)
//	SAGA_PARTICIPANT__HANDLER_ATTEMPTS  attempts at a failing handler (default 5)
//	SAGA_DEMO_BASE_PORT                 the demo's base port (default 8100; it listens on base+5)
//	SAGA_DEMO_UNSHIPPABLE               customers it cannot deliver to, comma-separated (default erin)
//
// Flags: --host (default 127.0.0.1) and --port (default base+5).
//
// It stops on SIGINT or SIGTERM: the HTTP server stops accepting and finishes
// its requests, the participant finishes the batch in hand and commits its
// offsets, then the pool is closed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	kit "github.com/saga-engine/saga-engine/kits/go"
)

func main() {
	os.Exit(run())
}

func run() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg, err := loadConfig(os.LookupEnv)
	if err != nil {
		log.Error("configuration", "error", err)
		return 2
	}
	flags := flag.NewFlagSet("shipping", flag.ContinueOnError)
	host := flags.String("host", "127.0.0.1", "address to listen on")
	port := flags.Int("port", cfg.Port, "port to listen on (SAGA_DEMO_BASE_PORT+5)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := prepareSchema(ctx, cfg.DSN, cfg.Schema); err != nil {
		log.Error("prepare the schema", "schema", cfg.Schema, "error", err)
		return 1
	}
	pool, err := openPool(ctx, cfg)
	if err != nil {
		log.Error("open the pool", "error", err)
		return 1
	}
	defer pool.Close()

	tp := sdktrace.NewTracerProvider() // real span ids in the replies' traceparent; no exporter
	defer func() { _ = tp.Shutdown(context.Background()) }()

	svc := &service{name: "shipping", schema: cfg.Schema, pool: pool, unshippable: cfg.Unshippable}
	k, err := kit.New(kit.Config{
		Name:              "shipping",
		Brokers:           cfg.Brokers,
		TopicPrefix:       cfg.TopicPrefix,
		Partitions:        cfg.Partitions,
		ReplicationFactor: cfg.ReplicationFactor,
		Pool:              pool,
		Schema:            cfg.Schema,
		MaxMessageBytes:   cfg.MaxMessageBytes,
		SessionTimeout:    cfg.SessionTimeout,
		HeartbeatInterval: cfg.HeartbeatInterval,
		InstanceID:        cfg.InstanceID,
		HandlerAttempts:   cfg.HandlerAttempts,
		DrillLedger:       cfg.DrillLedger,
		Logger:            log,
		TracerProvider:    tp,
		// /health answers once the participant has joined its consumer group, as
		// the Python services' does once their participant has started.
		KafkaOptions: []kgo.Opt{kgo.WithHooks(&svc.group)},
	})
	if err != nil {
		log.Error("configuration", "error", err)
		return 2
	}
	defer k.Close()
	svc.register(k)

	listener, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
	if err != nil {
		log.Error("listen", "error", err)
		return 1
	}
	server := &http.Server{Handler: svc.routes(), ReadHeaderTimeout: 10 * time.Second}

	participant := make(chan error, 1)
	go func() { participant <- k.Run(ctx) }()
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	log.Info("shipping service listening", "address", listener.Addr().String(),
		"schema", cfg.Schema, "topic_prefix", cfg.TopicPrefix, "unshippable", cfg.UnshippableList())

	code := 0
	select {
	case <-ctx.Done():
		log.Info("stopping")
	case err := <-participant:
		participant <- err // read again below
		if err != nil {
			log.Error("participant", "error", err)
		} else {
			log.Error("participant stopped on its own")
		}
		code = 1
	case err := <-served:
		log.Error("http server", "error", err)
		code = 1
	}
	stop() // the participant finishes the batch in hand, commits and returns

	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := server.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("http server shutdown", "error", err)
	}
	if err := <-participant; err != nil && code == 0 {
		log.Error("participant", "error", err)
		code = 1
	}
	log.Info("stopped")
	return code
}

// openPool opens the service's pool: its queries and the kit's transactions.
func openPool(ctx context.Context, cfg config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("SAGA_PARTICIPANT__DSN: %w", err)
	}
	pc.MaxConns = cfg.PoolMaxSize
	pc.MinConns = 1
	// Unqualified names resolve in the service's schema, as in the Python services.
	pc.ConnConfig.RuntimeParams["search_path"] = cfg.Schema
	return pgxpool.NewWithConfig(ctx, pc)
}
