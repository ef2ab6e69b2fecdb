package kit

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Crash points the kit passes (Config.CrashHook).
const (
	// CrashAfterOptimisticInsert: an optimistic pass's outcome and outbox row
	// inserted, its transaction not committed.
	CrashAfterOptimisticInsert = "after_optimistic_insert"
	// CrashAfterCommit: a command's transaction committed, its reply not sent.
	CrashAfterCommit = "after_commit"
)

// CrashAt returns the hook that SIGKILLs this process at the chosen pass of a
// crash point, for fault-injection tests, as the Python processes do with
// SAGA_CRASH_AT: "after_optimistic_insert:3" kills it the third time it
// passes that point (":1" when no count is given; several points may be
// listed, comma-separated). An empty spec gives nil (no hook).
func CrashAt(spec string) (func(point string), error) {
	targets, err := parseCrashSpec(spec)
	if err != nil || len(targets) == 0 {
		return nil, err
	}
	return crashHook(targets, func(point string, hit int) {
		fmt.Fprintf(os.Stderr, "crash point %s reached (hit %d): SIGKILL\n", point, hit)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}), nil
}

// parseCrashSpec reads "point[:count],...": the pass of each point to crash at.
func parseCrashSpec(spec string) (map[string]int, error) {
	targets := map[string]int{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, count, hasCount := strings.Cut(part, ":")
		n := 1
		if hasCount {
			var err error
			if n, err = strconv.Atoi(count); err != nil {
				return nil, fmt.Errorf("bad crash spec %q: use point[:count]", part)
			}
			if n < 1 {
				return nil, fmt.Errorf("bad crash spec %q: count must be >= 1", part)
			}
		}
		targets[name] = n
	}
	return targets, nil
}

// crashHook calls kill at the targets' passes.
func crashHook(targets map[string]int, kill func(point string, hit int)) func(point string) {
	var mu sync.Mutex
	hits := map[string]int{}
	return func(point string) {
		target, ok := targets[point]
		if !ok {
			return
		}
		mu.Lock()
		hits[point]++
		hit := hits[point]
		mu.Unlock()
		if hit == target {
			kill(point, hit)
		}
	}
}

// checkpoint passes a crash point (Config.CrashHook).
func (k *Kit) checkpoint(point string) {
	if k.cfg.CrashHook != nil {
		k.cfg.CrashHook(point)
	}
}
