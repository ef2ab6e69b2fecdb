"""One back-off for the in-process retry loops: a fetch, a reload, a publish, start-up.

These loops only pace a process's own attempts against a dependency that is away
(Postgres, Kafka, an HTTP endpoint, another writer). They are not the saga retry
policy (``_policy.RetryPolicy``): that one is durable and derived from the history, so
a replay waits exactly the same; here each process should wait a *different* time, so
that the engines and participants an outage hit together do not all come back at the
same instant.

One formula, "equal jitter": the n-th delay after a failure is drawn from ``[c/2, c]``
where ``c = min(maximum, initial * 2**(n-1))``. Half fixed, so retries never come
faster than half the curve; half random, so loops failing together spread out.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

#: Past this many doublings the ceiling is the maximum anyway; the cap keeps the float
#: power finite however long a dependency stays away.
_MAX_DOUBLINGS = 64


def jittered(failure: int, initial: float, maximum: float, rng: Callable[[], float]) -> float:
    """The delay after failure number ``failure`` (1-based); see the module docstring."""
    ceiling = min(maximum, initial * 2.0 ** min(max(0, failure - 1), _MAX_DOUBLINGS))
    return ceiling / 2 + rng() * ceiling / 2


class Backoff:
    """Capped exponential back-off with jitter for one retry loop::

        backoff = Backoff(0.1, 5.0)
        while True:
            try:
                await fetch()
            except KafkaError:
                await asyncio.sleep(backoff.next_delay())
                continue
            backoff.reset()  # the next outage starts from ``initial`` again

    ``rng`` is a test seam (a function returning a float in ``[0, 1)``).
    """

    __slots__ = ("_rng", "failures", "initial", "maximum")

    def __init__(
        self, initial: float, maximum: float, *, rng: Callable[[], float] = random.random
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"need 0 < initial <= maximum, not {initial!r} and {maximum!r}")
        self.initial = initial
        self.maximum = maximum
        #: Failures since the last reset: the delays drawn so far.
        self.failures = 0
        self._rng = rng

    def next_delay(self) -> float:
        """The delay to wait after one more failure, in seconds."""
        self.failures += 1
        return jittered(self.failures, self.initial, self.maximum, self._rng)

    def reset(self) -> None:
        """After a success: the next failure waits ``initial`` (jittered) again."""
        self.failures = 0

    async def sleep(self) -> float:
        """Waits the next delay; returns it (for the log line)."""
        delay = self.next_delay()
        await asyncio.sleep(delay)
        return delay

    def __repr__(self) -> str:
        return f"Backoff({self.initial!r}, {self.maximum!r}, failures={self.failures})"
