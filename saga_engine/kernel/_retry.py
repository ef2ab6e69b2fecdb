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

Each loop takes one of a few named :class:`BackoffProfile` s (``OUTAGE``, ``STARTUP``,
``HANDLER``, ``CONFLICT``, ``POLL``), never literal numbers, so that the same kind of
wait paces the same way everywhere (docs/operations.md, "Retries and how they nest").

:func:`is_transient` is the one rule of what a failure is: transient (the same work may
succeed a moment later: wait and retry) or not (fail once, clearly). The engine's
start-up, the participant kit, the dead-letter publisher and the CLI all ask it.
"""

from __future__ import annotations

import asyncio
import math
import random
import ssl
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from saga_engine.kernel._errors import PermanentError, TransientError

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


@dataclass(frozen=True, slots=True)
class BackoffProfile:
    """A named pace for one kind of retry loop: its first delay and its cap, in seconds
    (each delay jittered as the module docstring says)."""

    name: str
    initial: float
    maximum: float

    def backoff(self, *, rng: Callable[[], float] = random.random) -> Backoff:
        """A fresh :class:`Backoff` at this pace."""
        return Backoff(self.initial, self.maximum, rng=rng)


#: A dependency away (Postgres, Kafka) while a loop does its work: a fetch, a batch, an
#: outbox write, a dead letter. Quick at first (a blip), then every 5 s at most.
OUTAGE: Final = BackoffProfile("outage", 0.1, 5.0)
#: A process starting while a server is not up yet, and the engine's polling loops: a
#: server that is starting takes seconds, and nothing waits on these in the meantime.
STARTUP: Final = BackoffProfile("startup", 0.5, 10.0)
#: One call tried again while its caller waits: a participant's handler attempts
#: (``handler_attempts``), an HTTP step's request within its ``retry_window_s``, a
#: reload notice to a saga's owner.
HANDLER: Final = BackoffProfile("handler", 0.05, 2.0)
#: A write that lost a race with another writer, rebuilt from the store between tries.
CONFLICT: Final = BackoffProfile("conflict", 0.05, 0.2)
#: A caller polling for a state to change (``SagaClient.result``, ``wait_batch``).
POLL: Final = BackoffProfile("poll", 0.02, 1.0)


# --------------------------------------------------------------------------- transient

#: Kafka refusals that the same request meets every time (by class name: the kernel
#: imports no client library): the record is too large, a setting or permission is
#: wrong, the broker cannot do it. Every other Kafka error is the broker being away,
#: electing a leader or timing out.
_KAFKA_PERMANENT: Final = frozenset(
    {
        "MessageSizeTooLargeError",
        "RecordTooLargeError",
        "RecordListTooLargeError",
        "OffsetMetadataTooLargeError",
        "InvalidTopicError",
        "InvalidRequiredAcksError",
        "InvalidPartitionsError",
        "InvalidReplicationFactorError",
        "InvalidConfigurationError",
        "InvalidGroupIdError",
        "InvalidSessionTimeoutError",
        "PolicyViolationError",
        "UnsupportedCodecError",
        "UnsupportedVersionError",
        "UnsupportedForMessageFormatError",
        "UnrecognizedBrokerVersion",
        "IncompatibleBrokerVersion",
        "KafkaConfigurationError",
        "IllegalArgumentError",
        "AuthenticationFailedError",
        "AuthenticationMethodNotSupported",
        "SaslAuthenticationFailed",
        "UnsupportedSaslMechanismError",
        "IllegalSaslStateError",
        "SecurityDisabled",
        "TopicAuthorizationFailedError",
        "GroupAuthorizationFailedError",
        "ClusterAuthorizationFailedError",
        "TransactionalIdAuthorizationFailed",
    }
)
#: SQLSTATE classes that mean "the server or the connection is in trouble", not "this
#: request is wrong": 08 connection exception, 40 transaction rollback (serialization
#: failure, deadlock), 53 insufficient resources (too many connections), 57 operator
#: intervention (shutdown, restart, 57P03 "the database system is not yet accepting
#: connections" while it recovers), 58 system error (I/O).
_PG_TRANSIENT_CLASSES: Final = frozenset({"08", "40", "53", "57", "58"})
#: asyncpg's client-side errors of a connection that broke (no SQLSTATE).
_PG_CLIENT_TRANSIENT: Final = frozenset({"InterfaceError", "ConnectionDoesNotExistError"})
#: OSErrors that are a setting or a file to fix, not a server still starting.
_OS_PERMANENT: Final = (
    ssl.SSLCertVerificationError,
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from (``raise ... from``), outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


def _library(exc: BaseException, package: str) -> bool:
    module = type(exc).__module__
    return module == package or module.startswith(package + ".")


def _permanent(exc: BaseException) -> bool:
    if isinstance(exc, (PermanentError, *_OS_PERMANENT)):
        return True
    return _library(exc, "aiokafka") and type(exc).__name__ in _KAFKA_PERMANENT


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, TransientError | OSError | TimeoutError):
        return True  # refused, reset, no route, timed out (socket errors are OSErrors)
    if _library(exc, "aiokafka"):
        return type(exc).__name__ not in _KAFKA_PERMANENT
    if _library(exc, "asyncpg"):
        sqlstate = getattr(exc, "sqlstate", None)
        if isinstance(sqlstate, str):
            return sqlstate[:2] in _PG_TRANSIENT_CLASSES
        return type(exc).__name__ in _PG_CLIENT_TRANSIENT
    return False


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is transient: the same work may succeed a moment later (a server
    away, starting or overloaded, a connection lost, a race lost), so wait and retry. Not
    transient: fail once, clearly (a bug, a setting, a refusal that every retry meets,
    such as a record over the broker's size limit).

    What ``exc`` was raised from counts: a ``KafkaUnavailable`` raised from a
    ``MessageSizeTooLargeError`` is not transient, as no retry will make the record fit.
    """
    causes = list(_causes(exc))
    if any(_permanent(e) for e in causes):
        return False
    return any(_transient(e) for e in causes)
