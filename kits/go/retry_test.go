package kit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestJitteredDoublesFromInitialToMaxWithinTheUpperHalf(t *testing.T) {
	low := func() float64 { return 0 }
	high := func() float64 { return 1 }
	want := []time.Duration{100, 200, 400, 800, 1000, 1000} // ms ceilings, max 1 s
	for i, c := range want {
		ceiling := c * time.Millisecond
		if got := jittered(i+1, 100*time.Millisecond, time.Second, low); got != ceiling/2 {
			t.Errorf("failure %d at the lowest jitter: %v, want %v", i+1, got, ceiling/2)
		}
		if got := jittered(i+1, 100*time.Millisecond, time.Second, high); got != ceiling {
			t.Errorf("failure %d at the highest jitter: %v, want %v", i+1, got, ceiling)
		}
	}
	// A long outage stays at the cap (no overflow).
	if got := jittered(10_000, 100*time.Millisecond, time.Second, high); got != time.Second {
		t.Errorf("failure 10000: %v, want the cap", got)
	}
}

func TestTheDefaultsAreThePythonKits(t *testing.T) {
	k, err := New(Config{Name: "p", Brokers: []string{"x:1"}, DSN: "postgres://u@127.0.0.1:1/db"})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	cfg := k.Config()
	// saga_engine: handler_attempts=5, Participant(backoff_base_s=0.05, backoff_max_s=2.0)
	if cfg.HandlerAttempts != 5 || cfg.RetryBackoff != 50*time.Millisecond || paceHandler.max != 2*time.Second {
		t.Errorf("HandlerAttempts %d, RetryBackoff %v, cap %v; want 5, 50ms, 2s",
			cfg.HandlerAttempts, cfg.RetryBackoff, paceHandler.max)
	}
	if paceOutage != (pace{100 * time.Millisecond, 5 * time.Second}) || paceStartup != (pace{500 * time.Millisecond, 10 * time.Second}) {
		t.Errorf("outage %v, startup %v: not the Python kit's OUTAGE and STARTUP", paceOutage, paceStartup)
	}
}

func TestStartUpWaitsForPostgresStillRecoveringAndStopsAtARealError(t *testing.T) {
	k := &Kit{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	// What pgx returns while Postgres recovers after a restart (SQLSTATE 57P03).
	recovering := &pgconn.PgError{Code: "57P03", Message: "the database system is not yet accepting connections"}
	calls := 0
	err := k.untilReachable(context.Background(), "Postgres", func(context.Context) error {
		calls++
		if calls <= 2 {
			return recovering
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("got %v after %d calls; want success at the third", err, calls)
	}
	denied := &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}
	calls = 0
	err = k.untilReachable(context.Background(), "Postgres", func(context.Context) error {
		calls++
		return denied
	})
	if !errors.Is(err, denied) || calls != 1 {
		t.Fatalf("got %v after %d calls; want the password error at once", err, calls)
	}
}
