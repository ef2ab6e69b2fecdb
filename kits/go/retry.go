package kit

import (
	"context"
	"math/rand/v2"
	"time"
)

// The back-off profiles, as the Python kit and the engine name them
// (saga_engine/kernel/_retry.py, docs/operations.md "Retries and how they
// nest"): a first delay and a cap.
type pace struct{ initial, max time.Duration }

var (
	// paceOutage: Postgres or Kafka away while working (a produce, a topic, an
	// outbox row, the database during a command's transaction).
	paceOutage = pace{100 * time.Millisecond, 5 * time.Second}
	// paceStartup: Run waiting for Postgres at start (a server starting or
	// recovering: "the database system is not yet accepting connections").
	paceStartup = pace{500 * time.Millisecond, 10 * time.Second}
	// paceHandler: a handler's attempts; its initial delay is
	// Config.RetryBackoff (default 50 ms).
	paceHandler = pace{50 * time.Millisecond, 2 * time.Second}
)

// jittered is the delay after failure number failure (1-based), "equal
// jitter" as in the Python kit: drawn from [c/2, c] where
// c = min(max, initial * 2^(failure-1)). Half fixed, so retries never come
// faster than half the curve; half random, so instances an outage hit
// together do not all come back at the same instant.
func jittered(failure int, initial, max time.Duration, random func() float64) time.Duration {
	ceiling := initial
	for i := 1; i < failure && ceiling < max; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, max)
	return ceiling/2 + time.Duration(random()*float64(ceiling/2))
}

// delay is the jittered delay after failure number failure at pace p.
func (p pace) delay(failure int) time.Duration {
	return jittered(failure, p.initial, p.max, rand.Float64)
}

// handlerDelay is the delay after a handler's failure number failures: the
// handler pace from Config.RetryBackoff.
func (k *Kit) handlerDelay(failures int) time.Duration {
	return jittered(failures, k.cfg.RetryBackoff, max(paceHandler.max, k.cfg.RetryBackoff), rand.Float64)
}

// untilReachable runs fn until it succeeds, fails with an error that is not
// transient (a password, a bad schema: returned at once), or ctx ends,
// waiting the start-up pace between tries and logging each one: a participant
// started while Postgres is still starting or recovering waits for it, as the
// engine and the Python kit do, instead of exiting.
func (k *Kit) untilReachable(ctx context.Context, what string, fn func(context.Context) error) error {
	for failure := 1; ; failure++ {
		err := fn(ctx)
		if err == nil || !transient(err) || ctx.Err() != nil {
			return err
		}
		d := paceStartup.delay(failure)
		k.log.Warn(what+" not reachable yet; retrying", "attempt", failure, "in", d, "error", err)
		if !sleep(ctx, d) {
			return ctx.Err()
		}
	}
}
