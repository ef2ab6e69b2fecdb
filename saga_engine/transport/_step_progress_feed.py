"""Reading ``{prefix}.progress`` into a sink: each admin process's own reader of the
participants' step reports (``_step_progress``).

No consumer group: every process reads every partition, from the end (a report older
than the process is of no use), and commits nothing. A record that cannot be read (no
value, not JSON, not the record's shape, over the size limit) is dropped, counted by its
reason and logged at most once a minute per reason: a hostile or broken producer never
stops the reader nor the admin.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from aiokafka.errors import KafkaError

from saga_engine.kernel._settings import KafkaSettings
from saga_engine.transport._kafka import make_consumer
from saga_engine.transport._step_progress import (
    StepProgressRecord,
    UnreadableProgress,
    decode_step_progress,
)
from saga_engine.transport._topics import Topics

__all__ = ["StepProgressFeed"]

log = logging.getLogger("saga_engine.progress")

#: A reason's drops are logged at most once per this many seconds.
_LOG_EVERY_S: Final = 60.0


class StepProgressFeed:
    """Reads ``{prefix}.progress`` and hands each readable record to ``sink``.

    ``stats`` counts ``step_progress_read`` and ``step_progress_dropped_{reason}``
    (``oversized``, ``malformed``, ``sink``: the sink raised)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        sink: Callable[[StepProgressRecord], object],
        stats: collections.Counter[str] | None = None,
    ) -> None:
        self._kafka = kafka
        self._sink = sink
        self.stats: collections.Counter[str] = stats if stats is not None else collections.Counter()
        self._logged: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        #: Set once every partition is assigned and positioned at its end: a report
        #: sent after that is read.
        self.ready = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="step-progress-feed")

    async def positioned(self, seconds: float) -> bool:
        """Waits (at most ``seconds``) until the reader is at the end of every partition:
        a report sent after that is read. False if it is not yet (it goes on trying)."""
        try:
            await asyncio.wait_for(self.ready.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def take(self, value: bytes | None) -> None:
        """One record's value: to the sink, or dropped and counted."""
        try:
            record = decode_step_progress(value)
        except UnreadableProgress as exc:
            self._drop(exc.reason, str(exc))
            return
        try:
            self._sink(record)
        except Exception as exc:  # the board is ours: a bug there must not stop the reader
            self._drop("sink", repr(exc))
            return
        self.stats["step_progress_read"] += 1

    def _drop(self, reason: str, detail: str) -> None:
        self.stats[f"step_progress_dropped_{reason}"] += 1
        now = time.monotonic()
        if now - self._logged.get(reason, -_LOG_EVERY_S) >= _LOG_EVERY_S:
            self._logged[reason] = now
            log.warning("a step progress record was dropped (%s); others may follow", detail)

    async def _run(self) -> None:
        topic = Topics.of(self._kafka).progress
        while True:
            # No group: a subscription assigns every partition.
            consumer: Any = make_consumer(
                self._kafka, topic, group_id=None, auto_offset_reset="latest"
            )
            try:
                await consumer.start()
                await _from_the_end(consumer, topic)
                self.ready.set()
                while True:
                    batches = await consumer.getmany(timeout_ms=1000)
                    for records in batches.values():
                        for record in records:
                            self.take(record.value)
            except KafkaError as exc:
                log.warning("reading %s failed (%r); starting again in 1 s", topic, exc)
            finally:
                await consumer.stop()
            await asyncio.sleep(1.0)


async def _from_the_end(consumer: Any, topic: str) -> None:
    """Positions every partition of ``topic`` (all assigned: no group) at its end now."""
    assigned = sorted(consumer.assignment(), key=lambda tp: tp.partition)
    if not assigned:
        raise KafkaError(f"topic {topic} has no partitions yet")
    await consumer.seek_to_end(*assigned)
    for tp in assigned:
        await consumer.position(tp)
