package kit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// harness runs a kit against the real Kafka and Postgres named by
// SAGA_TEST_KAFKA and SAGA_TEST_PG_DSN, on a topic prefix and a schema of
// its own, and reads what it writes to {prefix}.inbox and {prefix}.dlq.
type harness struct {
	t            *testing.T
	prefix       string
	schema       string
	name         string
	brokers, dsn string
	pool         *pgxpool.Pool // the test's own queries
	kit          *Kit
	// statements counts what the kit sends Postgres (its pool is its own).
	statements *statementCounter
	kitPools   []*pgxpool.Pool
	client     *kgo.Client // produces commands, reads the inbox and the dead letters

	mu      sync.Mutex
	records map[string][]*kgo.Record // by topic

	cancel context.CancelFunc
	done   chan error
}

const testPartitions = 2

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newHarness(t *testing.T, configure func(*Config)) *harness {
	t.Helper()
	brokers, dsn := os.Getenv("SAGA_TEST_KAFKA"), os.Getenv("SAGA_TEST_PG_DSN")
	if brokers == "" || dsn == "" {
		t.Skip("integration test: set SAGA_TEST_KAFKA (bootstrap servers) and SAGA_TEST_PG_DSN (a Postgres DSN) to run it against real servers")
	}
	h := &harness{t: t, prefix: "gokittest" + randomHex(4), schema: "gokit_test_" + randomHex(4), name: "p", records: map[string][]*kgo.Record{}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	h.pool, h.brokers, h.dsn = pool, brokers, dsn
	h.statements = &statementCounter{}
	h.exec(`CREATE SCHEMA ` + pgx.Identifier{h.schema}.Sanitize())
	h.exec(`CREATE TABLE ` + h.table("effects") + ` (id bigserial PRIMARY KEY, key text NOT NULL)`)

	h.client, err = kgo.NewClient(kgo.SeedBrokers(brokers),
		kgo.ConsumeTopics(h.prefix+".inbox", h.prefix+".dlq", h.prefix+".other", h.prefix+".progress"),
		kgo.ConsumeStartOffset(kgo.NewOffset().AtStart()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.ProducerBatchMaxBytes(2_000_000))
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(h.client)
	topics := []string{h.prefix + ".inbox", h.prefix + ".dlq", h.prefix + ".cmd." + h.name, h.prefix + ".progress"}
	if _, err := adm.CreateTopics(ctx, testPartitions, 1, nil, topics...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.stop()
		for _, p := range h.kitPools {
			p.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, append(topics, h.prefix+".other")...)
		_, _ = adm.DeleteGroup(ctx, h.prefix+".participant."+h.name)
		h.client.Close()
		_, _ = pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{h.schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	go h.read()

	cfg := h.config(brokers, h.kitPool(dsn, h.statements), "test-"+randomHex(3))
	if configure != nil {
		configure(&cfg)
	}
	h.kit, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// config is the harness kit's configuration on pool.
func (h *harness) config(brokers string, pool *pgxpool.Pool, instance string) Config {
	return Config{
		Name: h.name, Brokers: []string{brokers}, TopicPrefix: h.prefix, Partitions: testPartitions,
		Pool: pool, Schema: h.schema, InstanceID: instance,
		HandlerAttempts: 2, RetryBackoff: 10 * time.Millisecond, ShutdownTimeout: 20 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	}
}

// kitPool is a pool of the kit's own, whose statements counter counts (nil:
// none), closed at the test's end.
func (h *harness) kitPool(dsn string, counter *statementCounter) *pgxpool.Pool {
	h.t.Helper()
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		h.t.Fatal(err)
	}
	if counter != nil {
		pc.ConnConfig.Tracer = counter
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		h.t.Fatal(err)
	}
	h.kitPools = append(h.kitPools, pool)
	return pool
}

// statementCounter is a pgx tracer that keeps the SQL of every statement its
// pool sends while it is on: each is one round trip once the connection has
// the statement prepared (pgx caches them per connection).
type statementCounter struct {
	mu  sync.Mutex
	on  bool
	sql []string
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.on {
		c.sql = append(c.sql, d.SQL)
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// start begins counting from zero.
func (c *statementCounter) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on, c.sql = true, nil
}

// stop ends counting and returns the statements seen.
func (c *statementCounter) stop() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = false
	return c.sql
}

// eventually polls cond for up to 30 s.
func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("not after 30 s: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *harness) table(name string) string { return pgx.Identifier{h.schema, name}.Sanitize() }

func (h *harness) exec(sql string, args ...any) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.pool.Exec(ctx, sql, args...); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) count(sql string, args ...any) int64 {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	if err := h.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

func (h *harness) read() {
	for {
		fetches := h.client.PollFetches(context.Background())
		if fetches.IsClientClosed() {
			return
		}
		fetches.EachRecord(func(r *kgo.Record) {
			h.mu.Lock()
			h.records[r.Topic] = append(h.records[r.Topic], r)
			h.mu.Unlock()
		})
	}
}

// start runs the kit until stop.
func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.kit.Run(ctx) }()
}

// stop cancels Run and waits (boundedly) for it to return.
func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
	case <-time.After(40 * time.Second):
		h.t.Errorf("Run did not return within 40 s of its context's cancellation")
	}
	h.cancel = nil
}

// command builds a saga.command as the engine sends it; extra headers are
// appended (a nil value removes the header).
func (h *harness) command(typ, sagaID, commandID, body string, extra ...Header) *kgo.Record {
	hs := []Header{
		{hSpecVersion, []byte("1.0")}, {hContentType, []byte("application/json")},
		{hID, []byte(newID())}, {hType, []byte("saga.command")}, {hSource, []byte("/saga-engine/test")},
		{hSubject, []byte(typ)}, {hTime, []byte(formatTime(time.Now()))}, {hSagaID, []byte(sagaID)},
		{hSagaType, []byte("test")}, {hCommandID, []byte(commandID)}, {hStep, []byte("step")},
		{hCorrelationID, []byte(sagaID)}, {hCausationID, []byte(commandID)},
		{hReplyTo, []byte(h.prefix + ".inbox")}, {hSchemaVersion, []byte("1")},
	}
	for _, e := range extra {
		rec := &Record{Headers: hs}
		set(e.Key, e.Value)(rec)
		hs = rec.Headers
	}
	return &kgo.Record{Topic: h.prefix + ".cmd." + h.name, Key: []byte(sagaID), Value: []byte(body), Headers: toKgoHeaders(hs)}
}

func (h *harness) send(recs ...*kgo.Record) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.client.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		h.t.Fatal(err)
	}
}

// await waits up to 30 s for n records on topic (suffix inbox, dlq, other, progress)
// that match, and returns them.
func (h *harness) await(suffix string, n int, match func(*kgo.Record) bool) []*kgo.Record {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var out []*kgo.Record
		h.mu.Lock()
		for _, r := range h.records[h.prefix+"."+suffix] {
			if match(r) {
				out = append(out, r)
			}
		}
		h.mu.Unlock()
		if len(out) >= n {
			return out
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%d of %d records on %s after 30 s", len(out), n, suffix)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func header(r *kgo.Record, name string) string {
	v := ""
	for _, h := range r.Headers {
		if h.Key == name {
			v = string(h.Value)
		}
	}
	return v
}

func byCommand(id string) func(*kgo.Record) bool {
	return func(r *kgo.Record) bool { return header(r, hCommandID) == id }
}

// replyOf decodes a reply's value.
func replyOf(t *testing.T, r *kgo.Record) (outcome string, payload map[string]any, errText string) {
	t.Helper()
	var b struct {
		Outcome string         `json:"outcome"`
		Payload map[string]any `json:"payload"`
		Error   *string        `json:"error"`
	}
	if err := json.Unmarshal(r.Value, &b); err != nil {
		t.Fatalf("reply %s: %v", r.Value, err)
	}
	if b.Error != nil {
		errText = *b.Error
	}
	return b.Outcome, b.Payload, errText
}
