"""A handler's reports on the step it handles (``tx.progress``), sent fire and forget on
``{prefix}.progress`` (the record: ``transport._step_progress``; PROTOCOL.md 5b).

Nothing here can fail a handler: a report that is not JSON or is over the size limit is
dropped, one the producer cannot send (Kafka away, too many in flight) is dropped, and
each drop is counted in the participant's ``stats`` (``step_progress_dropped``; sent ones
in ``step_progress_sent``) and logged at most once a minute.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Final

from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from saga_engine.transport._step_progress import STEP_PROGRESS_TYPE, encode_step_progress
from saga_engine.transport._wire import Envelope

__all__ = ["StepReporter"]

log = logging.getLogger("saga_engine.participant")

#: At most this many reports waiting to be handed to the producer; more are dropped.
_MAX_IN_FLIGHT: Final = 256
#: How long handing one report to the producer may take (it waits for the topic's
#: metadata while Kafka is away) before it counts as dropped.
_SEND_TIMEOUT_S: Final = 10.0
_LOG_EVERY_S: Final = 60.0


class StepReporter:
    """Sends reports on ``topic`` with ``producer``, one after another in the order they
    were made (one saga's reports stay in order on its partition); counts in ``stats``."""

    def __init__(
        self, producer: AIOKafkaProducer, topic: str, stats: collections.Counter[str]
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._stats = stats
        self._queue: asyncio.Queue[tuple[bytes, bytes]] = asyncio.Queue(_MAX_IN_FLIGHT)
        self._pump: asyncio.Task[None] | None = None
        self._logged = -_LOG_EVERY_S

    def report(self, command: Envelope, attempt: int, seq: int, body: Any) -> None:
        """Queues one report to be sent in the background; never raises."""
        try:
            value = encode_step_progress(
                saga_id=command.saga_id,
                command_id=command.command_id,
                step=command.step,
                attempt=attempt,
                seq=seq,
                body=body.model_dump(mode="json") if isinstance(body, BaseModel) else body,
            )
            self._queue.put_nowait((command.saga_id.encode(), value))
            if self._pump is None or self._pump.done():
                self._pump = asyncio.get_running_loop().create_task(self._send_queued())
        except asyncio.QueueFull:
            self._dropped(f"{_MAX_IN_FLIGHT} progress reports are waiting to be sent already")
        except Exception as exc:  # not JSON, too large, a model that cannot dump: never raise
            self._dropped(f"a progress report of {command.command_id} cannot be sent: {exc}")

    async def _send_queued(self) -> None:
        headers = [
            ("ce_type", STEP_PROGRESS_TYPE.encode()),
            ("content-type", b"application/json"),
        ]
        while not self._queue.empty():
            key, value = self._queue.get_nowait()
            try:
                # In order: each is in the producer's batch before the next is added.
                sent = await asyncio.wait_for(
                    self._producer.send(self._topic, value, key=key, headers=headers),
                    _SEND_TIMEOUT_S,
                )
            except Exception as exc:  # fire and forget: a lost report is only counted
                self._dropped(f"a progress report was not sent: {exc!r}")
                continue
            sent.add_done_callback(self._acknowledged)

    def _acknowledged(self, sent: asyncio.Future[Any]) -> None:
        if sent.cancelled() or sent.exception() is not None:
            self._dropped(f"a progress report was not sent: {sent!r}")
        else:
            self._stats["step_progress_sent"] += 1

    def _dropped(self, why: str) -> None:
        self._stats["step_progress_dropped"] += 1
        now = time.monotonic()
        if now - self._logged >= _LOG_EVERY_S:
            self._logged = now
            log.warning("%s (dropped; others may follow)", why)
