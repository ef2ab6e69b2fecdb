"""Dead-lettering a consumed record, retried while the broker is away: the one way every
consumer (the saga inbox, the trigger and event-source consumers, a participant) sends a
record to the dead-letter topic.

A record that is dead-lettered must not be skipped unrecorded, so a transient failure
(``is_transient``) is retried with the ``OUTAGE`` back-off until the record is sent or
the consumer stops; any other failure is raised at once (retrying it would stall the
partition for ever).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from saga_engine.kernel._retry import OUTAGE, Backoff, is_transient
from saga_engine.transport._bus import DeadLetterPublisher

__all__ = ["publish_dead_letter"]

log = logging.getLogger("saga_engine.dead_letters")


async def publish_dead_letter(
    dead: DeadLetterPublisher,
    record: Any,
    *,
    reason: str,
    detail: str,
    consumer: str,
    running: Callable[[], bool] = lambda: True,
    pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
    backoff: Backoff | None = None,
) -> None:
    """Sends ``record`` to the dead-letter topic with its reason, retrying a transient
    failure with the ``OUTAGE`` back-off (or ``backoff``).

    Raises a failure that is not transient at once, and a transient one once
    ``running()`` is false (the consumer is stopping: the record's offset is not
    committed, so the next reader dead-letters it). ``pause`` waits between tries (a
    participant's raises when it stops)."""
    backoff = backoff or OUTAGE.backoff()
    while True:
        try:
            await dead.publish_record(record, reason=reason, detail=detail, consumer=consumer)
            return
        except Exception as exc:
            if not is_transient(exc) or not running():
                raise
            delay = backoff.next_delay()
            log.warning("dead-lettering a record failed (%r); retrying in %.2fs", exc, delay)
            await pause(delay)
