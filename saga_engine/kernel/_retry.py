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
import math
import random
import sys
from collections.abc import Callable

#: Below this a float power of the exponent's size is finite.
_LOG_FLOAT_MAX = math.log(sys.float_info.max)


def capped_exponential(
    failure: int, initial: float, maximum: float, multiplier: float = 2.0
) -> float:
    """``min(maximum, initial * multiplier**(failure-1))``, finite at every ``failure``.

    The one exponential curve of every back-off (these loops' and the durable
    ``RetryPolicy``'s): the power is compared with the cap in logarithms first, so it is
    only computed while it stays below the cap, and a retry after any number of
    failures (a child waited for days, a dependency away for weeks) gets the cap, never
    an ``OverflowError``. ``failure`` is 1-based; below 1 counts as 1."""
    steps = max(0, failure - 1)
    if initial <= 0 or steps == 0 or multiplier <= 1.0:
        return min(initial, maximum)
    if initial >= maximum:
        return maximum
    exponent = steps * math.log(multiplier)
    if exponent >= math.log(maximum) - math.log(initial):
        return maximum
    if exponent < _LOG_FLOAT_MAX:
        return min(maximum, initial * multiplier**steps)  # exact: replays compare it
    return min(maximum, math.exp(math.log(initial) + exponent))


def jittered(failure: int, initial: float, maximum: float, rng: Callable[[], float]) -> float:
    """The delay after failure number ``failure`` (1-based); see the module docstring."""
    ceiling = capped_exponential(failure, initial, maximum)
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
