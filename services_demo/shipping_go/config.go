package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The defaults of saga_engine's Settings and services_demo.config.DemoSettings.
const (
	defaultDSN       = "postgresql://postgres@127.0.0.1:54329/saga"
	defaultBrokers   = "127.0.0.1:19092"
	defaultBasePort  = 8100
	shippingOffset   = 5 // services_demo.config.PORT_OFFSETS["shipping"]
	defaultSchema    = "saga_participant"
	defaultPrefix    = "saga"
	defaultAttempts  = 5
	defaultPoolSize  = 5
	defaultUnshipped = "erin"
)

var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// config is what the service reads from the SAGA_* environment.
type config struct {
	DSN               string
	Schema            string
	PoolMaxSize       int32
	HandlerAttempts   int
	Brokers           []string
	TopicPrefix       string
	Partitions        int32
	ReplicationFactor int16
	MaxMessageBytes   int
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	InstanceID        string
	DrillLedger       bool // SAGA_PARTICIPANT__DRILL_LEDGER=1: the kit records its applications for `saga drill`
	Port              int
	Unshippable       map[string]bool
}

// UnshippableList is the unshippable customers, sorted (for the log).
func (c config) UnshippableList() []string {
	var names []string
	for n := range c.Unshippable {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// loadConfig reads the environment through lookup (os.LookupEnv).
func loadConfig(lookup func(string) (string, bool)) (config, error) {
	get := func(name, def string) string {
		if v, ok := lookup(name); ok && strings.TrimSpace(v) != "" {
			return strings.TrimSpace(v)
		}
		return def
	}
	var problems []string
	integer := func(name string, def, low, high int) int {
		raw := get(name, strconv.Itoa(def))
		n, err := strconv.Atoi(raw)
		if err != nil || n < low || n > high {
			problems = append(problems, fmt.Sprintf("%s=%q: want an integer from %d to %d", name, raw, low, high))
			return def
		}
		return n
	}
	c := config{
		DSN:               get("SAGA_PARTICIPANT__DSN", get("SAGA_PG__DSN", defaultDSN)),
		Schema:            get("SAGA_PARTICIPANT__DB_SCHEMA", defaultSchema),
		PoolMaxSize:       int32(integer("SAGA_PARTICIPANT__POOL_MAX_SIZE", defaultPoolSize, 1, 1000)),
		HandlerAttempts:   integer("SAGA_PARTICIPANT__HANDLER_ATTEMPTS", defaultAttempts, 1, 1000),
		TopicPrefix:       get("SAGA_KAFKA__TOPIC_PREFIX", defaultPrefix),
		Partitions:        int32(integer("SAGA_KAFKA__PARTITIONS", 8, 1, 100_000)),
		ReplicationFactor: int16(integer("SAGA_KAFKA__REPLICATION_FACTOR", 1, 1, 100)),
		MaxMessageBytes:   integer("SAGA_KAFKA__MAX_MESSAGE_BYTES", 1_000_000, 1024, 1<<30),
		SessionTimeout:    time.Duration(integer("SAGA_KAFKA__SESSION_TIMEOUT_MS", 6000, 1000, 3_600_000)) * time.Millisecond,
		HeartbeatInterval: time.Duration(integer("SAGA_KAFKA__HEARTBEAT_INTERVAL_MS", 1000, 100, 3_600_000)) * time.Millisecond,
		InstanceID:        get("SAGA_KAFKA__GROUP_INSTANCE_ID", ""),
		DrillLedger:       get("SAGA_PARTICIPANT__DRILL_LEDGER", "") == "1",
		Port:              integer("SAGA_DEMO_BASE_PORT", defaultBasePort, 0, 65535-shippingOffset) + shippingOffset,
	}
	// Set but empty: nobody is unshippable (as in DemoSettings).
	if v, ok := lookup("SAGA_DEMO_UNSHIPPABLE"); ok {
		c.Unshippable = names(v)
	} else {
		c.Unshippable = names(defaultUnshipped)
	}
	for _, b := range strings.Split(get("SAGA_KAFKA__BOOTSTRAP_SERVERS", defaultBrokers), ",") {
		if b = strings.TrimSpace(b); b != "" {
			c.Brokers = append(c.Brokers, b)
		}
	}
	if len(c.Brokers) == 0 {
		problems = append(problems, "SAGA_KAFKA__BOOTSTRAP_SERVERS: no broker")
	}
	if !schemaPattern.MatchString(c.Schema) {
		problems = append(problems, fmt.Sprintf("SAGA_PARTICIPANT__DB_SCHEMA=%q: use lowercase letters, digits and '_'", c.Schema))
	}
	if len(problems) > 0 {
		return config{}, fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return c, nil
}

// names splits a comma-separated list, as services_demo.config._names does.
func names(value string) map[string]bool {
	out := map[string]bool{}
	for _, n := range strings.Split(value, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out[n] = true
		}
	}
	return out
}
