"""The one rule of what is transient (``saga_engine.kernel._retry.is_transient``): wait
and retry, or fail once, clearly. The engine's start-up, the participant kit, the
dead-letter publisher and the CLI all ask it (issue 39, 3 and 8.6)."""

from __future__ import annotations

import ssl

import asyncpg
import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
)

from saga_engine.kernel._errors import (
    ConcurrencyError,
    KafkaUnavailable,
    PayloadTooLarge,
    SagaNotFound,
    StoreUnavailable,
)
from saga_engine.kernel._retry import is_transient


def _raised_from(outer: BaseException, cause: BaseException) -> BaseException:
    try:
        raise outer from cause
    except BaseException as exc:
        return exc


TRANSIENT = {
    # Postgres recovering after a restart (57P03), shutting down, out of connections,
    # a serialization failure, a lost connection.
    "postgres not yet accepting connections": asyncpg.exceptions.CannotConnectNowError(
        "the database system is not yet accepting connections"
    ),
    "postgres shutting down": asyncpg.exceptions.AdminShutdownError("terminating connection"),
    "postgres too many connections": asyncpg.exceptions.TooManyConnectionsError("too many"),
    "serialization failure": asyncpg.exceptions.SerializationError("could not serialize"),
    "connection lost": asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"),
    "asyncpg connection closed": asyncpg.exceptions.InterfaceError("connection is closed"),
    "refused": ConnectionRefusedError(111, "Connect call failed"),
    "asyncio's many addresses": OSError("Multiple exceptions: [Errno 111] Connect call failed"),
    "timed out": TimeoutError(),
    "broker away": KafkaConnectionError("no broker"),
    "no leader yet": NotLeaderForPartitionError(),
    "produce timed out": KafkaTimeoutError(),
    "our own": StoreUnavailable("Postgres is unavailable"),
    "a lost race": ConcurrencyError("s", 1, 2),
    "kafka unavailable from a connection error": _raised_from(
        KafkaUnavailable("could not publish"), KafkaConnectionError()
    ),
}

PERMANENT = {
    "a record over the broker's size limit": MessageSizeTooLargeError(),
    "the same, wrapped": _raised_from(
        KafkaUnavailable("could not publish"), MessageSizeTooLargeError()
    ),
    "over the payload limit": PayloadTooLarge(2_000_000, 1_000_000),
    "a wrong password": asyncpg.exceptions.InvalidPasswordError("password authentication failed"),
    "no such table": asyncpg.exceptions.UndefinedTableError("relation does not exist"),
    "a bad argument": asyncpg.exceptions.DataError("invalid input for query argument"),
    "sasl": SaslAuthenticationFailed(),
    "not allowed": TopicAuthorizationFailedError(),
    "a certificate": ssl.SSLCertVerificationError("certificate verify failed"),
    "a missing file": FileNotFoundError("ca.pem"),
    "a saga error": SagaNotFound("s"),
    "a bug": ValueError("bug"),
    "another bug": KeyError("x"),
}


@pytest.mark.parametrize("exc", list(TRANSIENT.values()), ids=list(TRANSIENT))
def test_what_may_succeed_a_moment_later_is_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize("exc", list(PERMANENT.values()), ids=list(PERMANENT))
def test_what_every_retry_would_meet_is_not(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_a_handled_failure_in_the_context_does_not_make_a_later_one_permanent() -> None:
    # Dead-lettering a poison message while the broker is away: the KafkaUnavailable is
    # raised while handling the saga error (its __context__), not from it.
    outage = KafkaUnavailable("broker away")
    outage.__context__ = SagaNotFound("s")
    assert is_transient(outage)
