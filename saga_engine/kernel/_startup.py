"""Start-up that waits for Kafka and Postgres instead of exiting.

Under an orchestrator a service and its dependencies start together, and a broker or a
database restarting is routine. An engine or participant that exits because one is not
up yet turns that into a restart loop (in a chaos run: 17 self-exits, one participant
down for 35 s). So start-up retries with back-off, one log line per attempt, for
``startup_timeout_s`` (unset: for ever).

Only unreachability is retried (``kernel._retry.is_transient``, the one rule of what is
transient, with what each client library says of its own errors). Each dependency is opened inside ``unreachable_as_unavailable(KAFKA)`` or
``unreachable_as_unavailable(POSTGRES)`` (the ``Dependency`` values of the transport and the store, each
knowing its client library's errors), which turns the errors that mean "not there (yet)"
into ``DependencyUnavailable``; anything else (a bad setting, a failed migration, a port
in use) fails the start at once with its own message.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from saga_engine.kernel._errors import DependencyUnavailable
from saga_engine.kernel._retry import STARTUP, is_transient

log = logging.getLogger("saga_engine.startup")


@dataclass(frozen=True, slots=True)
class Dependency:
    """A server a process needs at start-up: its name for messages, and which errors of
    its client library mean "not reachable (yet)" (the kernel imports no client library,
    so the store and the transport each say it of theirs)."""

    name: str
    unreachable: Callable[[BaseException], bool]


def _unreachable(dependency: Dependency, exc: BaseException) -> bool:
    """The one rule of what is transient (``is_transient``: refused, no route, timed out,
    Postgres starting or recovering, a broker electing a leader; not a certificate that
    fails verification, a password, a record too large), and what the dependency's own
    client library says of its errors."""
    if is_transient(exc):
        return True
    if isinstance(exc, ssl.SSLCertVerificationError):
        return False  # a TLS setting to fix, not a server still starting
    return dependency.unreachable(exc)


@contextmanager
def unreachable_as_unavailable(dependency: Dependency) -> Iterator[None]:
    """Marks the errors of opening ``dependency`` that mean it is not reachable."""
    try:
        yield
    except DependencyUnavailable:
        raise
    except Exception as exc:
        if not _unreachable(dependency, exc):
            raise
        raise DependencyUnavailable(dependency.name, exc) from exc


async def start_with_retry(
    what: str,
    attempt: Callable[[], Awaitable[None]],
    undo: Callable[[], Awaitable[None]],
    timeout_s: float | None,
) -> None:
    """Runs ``attempt`` until it succeeds; after each failure ``undo`` closes what it
    opened. A ``DependencyUnavailable`` is retried with the ``STARTUP`` back-off (0.5 s
    doubling up to 10 s, jittered: ``saga_engine.kernel._retry``) until ``timeout_s`` has passed; any other
    error is raised at once."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    backoff = STARTUP.backoff()
    attempts = 0
    while True:
        attempts += 1
        try:
            await attempt()
        except DependencyUnavailable as exc:
            await undo()
            waited = loop.time() - began
            delay = backoff.next_delay()
            if timeout_s is not None and waited + delay > timeout_s:
                raise DependencyUnavailable(
                    exc.dependency,
                    RuntimeError(
                        f"still unreachable after {waited:.1f}s and {attempts} attempts "
                        f"(startup_timeout_s={timeout_s:g}): {exc.cause}"
                    ),
                ) from exc
            log.warning(
                "%s: %s; attempt %d failed, trying again in %.1fs",
                what,
                exc,
                attempts,
                delay,
            )
            await asyncio.sleep(delay)
            continue
        except BaseException:
            await undo()
            raise
        if attempts > 1:
            log.info("%s: started after %d attempts", what, attempts)
        return
