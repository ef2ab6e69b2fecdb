package kit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// Config configures a participant. Name, Brokers and one of DSN or Pool are
// required; everything else has the protocol's default.
type Config struct {
	// Name is the participant's name: it consumes {prefix}.cmd.{Name}.
	Name string
	// Brokers are the Kafka bootstrap servers.
	Brokers []string
	// TopicPrefix is the deployment's topic prefix (default "saga").
	TopicPrefix string
	// Partitions and ReplicationFactor are used for the topics the kit creates
	// (defaults 8 and 1; section 1).
	Partitions        int32
	ReplicationFactor int16
	// GroupID is the consumer group (default {prefix}.participant.{Name}).
	GroupID string
	// DSN opens a pool the kit owns; or give Pool, which the kit never closes.
	DSN  string
	Pool *pgxpool.Pool
	// Schema is the Postgres schema of the kit's tables (default "public").
	Schema string
	// MaxMessageBytes is the message size limit of section 12 (default 1,000,000).
	MaxMessageBytes int
	// SessionTimeout (default 6 s) and HeartbeatInterval (default 1 s) of the
	// consumer group (section 7.6).
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	// InstanceID is group.instance.id (static membership): stable per
	// instance, distinct between instances. Default: {Name}-{host name}.
	InstanceID string
	// HandlerAttempts is how often a handler failing with an unexpected error
	// runs before the command is answered retryable (default 5, as the Python
	// kit's handler_attempts); RetryBackoff the first pause between attempts,
	// doubled each time up to 2 s, with equal jitter (default 50 ms).
	HandlerAttempts int
	RetryBackoff    time.Duration
	// ShutdownTimeout bounds how long Run keeps finishing the batch in hand
	// after its context is cancelled (default 30 s). Records not finished by
	// then are not committed and will be delivered again.
	ShutdownTimeout time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// TracerProvider for the handler spans (default otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
	// KafkaOptions are added to both Kafka clients (TLS, SASL, ...).
	KafkaOptions []kgo.Opt
	// DrillLedger records each command a handler applied (a success reply) in
	// a drill_ledger table of Schema, in the transaction that applies it, for
	// `saga drill` to count (SAGA_PARTICIPANT__DRILL_LEDGER=1, as the Python
	// kit does). Off in production.
	DrillLedger bool
	// Blobs turns on commands and replies by reference (BlobConfig); nil, a
	// record by reference is dead-lettered undecodable (check 8).
	Blobs *BlobConfig
	// CrashHook is a test seam: the kit calls it with the name of each crash
	// point it passes ("after_optimistic_insert": an optimistic pass's outcome
	// inserted, its transaction not committed; "after_commit": a command's
	// transaction committed, its reply not sent). CrashAt makes the hook
	// SAGA_CRASH_AT names. nil: none.
	CrashHook func(point string)
}

// HandlerFunc applies one command inside the kit's transaction, through tx:
// do not commit or roll it back (the kit does; both return an error). Its
// writes commit with the command's stored reply, or not at all; a handler
// that also acts outside tx is registered WithEffects(EffectsOutside). Return the
// reply payload (nil, a map or a struct that encodes to a JSON object), a
// *Rejected to refuse the command, or any other error to have it retried.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, cmd Command) (payload any, err error)

type handler struct {
	fn       HandlerFunc
	validate func(json.RawMessage) error
	effects  Effects
}

// Kit is a participant. Make one with New, register handlers, then Run.
type Kit struct {
	cfg      Config
	log      *slog.Logger
	tracer   trace.Tracer
	pool     *pgxpool.Pool
	ownsPool bool
	store    *store
	blobs    *blobs // nil: records by reference are not read
	source   string // ce_source of replies
	consumer string // dlq_consumer

	mu       sync.Mutex
	handlers map[string]*handler
	running  bool

	producer *kgo.Client
	topicsMu sync.Mutex
	topics   map[string]bool // topics known to exist

	// claimsLost counts the optimistic passes whose outcome's insert found
	// the command stored (ClaimsLost).
	claimsLost atomic.Uint64

	// Progress reports sent and dropped, and when a drop was last logged.
	progressSent, progressDropped atomic.Uint64
	progressLogged                atomic.Int64
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// New checks cfg, fills in its defaults and connects to Postgres (the pool is
// created lazily; nothing is sent until Run).
func New(cfg Config) (*Kit, error) {
	if !namePattern.MatchString(cfg.Name) {
		return nil, fmt.Errorf("kit: Name %q must be letters, digits, '.', '_' or '-'", cfg.Name)
	}
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kit: Brokers is empty")
	}
	if cfg.TopicPrefix == "" {
		cfg.TopicPrefix = "saga"
	}
	if !namePattern.MatchString(cfg.TopicPrefix) {
		return nil, fmt.Errorf("kit: TopicPrefix %q must be letters, digits, '.', '_' or '-'", cfg.TopicPrefix)
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 8
	}
	if cfg.ReplicationFactor <= 0 {
		cfg.ReplicationFactor = 1
	}
	if cfg.GroupID == "" {
		cfg.GroupID = cfg.TopicPrefix + ".participant." + cfg.Name
	}
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 1_000_000
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 6 * time.Second
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = min(time.Second, cfg.SessionTimeout/3)
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "host"
	}
	if cfg.InstanceID == "" {
		cfg.InstanceID = cfg.Name + "-" + host
	}
	if cfg.HandlerAttempts <= 0 {
		cfg.HandlerAttempts = 5
	}
	if cfg.RetryBackoff <= 0 {
		cfg.RetryBackoff = paceHandler.initial
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	k := &Kit{
		cfg:      cfg,
		log:      cfg.Logger.With("participant", cfg.Name),
		tracer:   cfg.TracerProvider.Tracer("github.com/saga-engine/saga-engine/kits/go"),
		pool:     cfg.Pool,
		source:   "/participants/" + cfg.Name,
		handlers: map[string]*handler{},
		topics:   map[string]bool{},
	}
	var suffix [3]byte
	_, _ = rand.Read(suffix[:])
	k.consumer = fmt.Sprintf("participant:%s:%s-%d-%s", cfg.Name, host, os.Getpid(), hex.EncodeToString(suffix[:]))
	if k.pool == nil {
		if cfg.DSN == "" {
			return nil, errors.New("kit: give DSN or Pool")
		}
		pool, err := pgxpool.New(context.Background(), cfg.DSN)
		if err != nil {
			return nil, fmt.Errorf("kit: %w", err)
		}
		k.pool, k.ownsPool = pool, true
	}
	k.store = newStore(k.pool, cfg.Schema)
	if cfg.Blobs != nil {
		b, err := newBlobs(*cfg.Blobs)
		if err != nil {
			k.Close()
			return nil, err
		}
		k.blobs = b
	}
	return k, nil
}

// Config returns the configuration with its defaults filled in.
func (k *Kit) Config() Config { return k.cfg }

// DeadLetterConsumer is the dlq_consumer this instance writes.
func (k *Kit) DeadLetterConsumer() string { return k.consumer }

// Handle registers the handler of a command type (ce_subject). Compensations
// are command types of their own. Register every handler before Run.
func (k *Kit) Handle(commandType string, fn HandlerFunc, opts ...HandlerOption) {
	h := &handler{fn: fn}
	for _, o := range opts {
		o(h)
	}
	if h.effects != EffectsTransaction && h.effects != EffectsOutside {
		panic(fmt.Sprintf("kit: Handle(%q): WithEffects(%v): give kit.EffectsTransaction or kit.EffectsOutside", commandType, h.effects))
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.running {
		panic("kit: Handle after Run")
	}
	k.handlers[commandType] = h
}

// HandleTyped registers a handler whose body is decoded into T, which is also
// the body's model (WithBody[T]); opts as for Handle (WithEffects).
func HandleTyped[T any](k *Kit, commandType string, fn func(ctx context.Context, tx pgx.Tx, cmd Command, body T) (any, error), opts ...HandlerOption) {
	k.Handle(commandType, func(ctx context.Context, tx pgx.Tx, cmd Command) (any, error) {
		var body T
		if err := cmd.Decode(&body); err != nil {
			return nil, err
		}
		return fn(ctx, tx, cmd, body)
	}, append([]HandlerOption{WithBody[T]()}, opts...)...)
}

// Close releases the pool if the kit opened it. Call it after Run returned.
func (k *Kit) Close() {
	if k.ownsPool {
		k.pool.Close()
	}
	if k.blobs != nil {
		k.blobs.close()
	}
}

// ClaimsLost returns how many optimistic passes found their command's outcome
// stored (a copy answered before, or meanwhile on another instance) and went
// the locked way, since the kit was made.
func (k *Kit) ClaimsLost() uint64 { return k.claimsLost.Load() }

// Topic names of section 1.
func (k *Kit) commandTopic() string { return k.cfg.TopicPrefix + ".cmd." + k.cfg.Name }
func (k *Kit) inboxTopic() string   { return k.cfg.TopicPrefix + ".inbox" }
func (k *Kit) dlqTopic() string     { return k.cfg.TopicPrefix + ".dlq" }

// sleep waits d or until ctx is done; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
