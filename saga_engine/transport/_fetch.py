"""Fetching for every consumer loop, so that a partition no fetch can read is reported.

A fetch can fail for a reason no retry cures: a batch compressed with a codec this
process lacks (``UnsupportedCodecError``), a batch whose CRC does not match, a codec
library refusing the bytes. aiokafka raises it from ``getmany`` on every call, without
saying which partition, and every caller retried in silence: all the consumer's
partitions stopped, not only the bad one (issue 22). Worse, the records it had already
drained from the other partitions in that call are dropped with their positions moved
past them, so a caller that just retried lost them until the next rebalance.

``GuardedFetch.getmany`` is the consumer's ``getmany`` plus, on such an error: every
partition is rewound to the caller's last record (nothing drained is lost), each is then
fetched alone to find the one that fails, and that one is paused and reported: an ERROR
naming the topic, partition and offset, the ``saga.kafka.fetch.unreadable`` metric, a
line on the health board. The others go on. A paused partition is tried again every
``retry_s`` (an operator may have installed the codec meanwhile) and reported again if
it still fails; its report is cleared once it reads.

``hold`` is the other reason to pause a partition: its records wait for something that
comes back by itself (past one database, their shard). It is read again from the given
record after ``retry_s``, with nothing reported here (the shard's trouble is on the
health board already).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CorruptRecordException, KafkaError, UnsupportedCodecError

from saga_engine.telemetry._health import HealthBoard

log = logging.getLogger("saga_engine.kafka")

#: Kafka errors that a fetch of the same bytes would raise again.
_FOR_GOOD: Final = (UnsupportedCodecError, CorruptRecordException)
#: How long a partition probed alone may take to show its records (or its error).
_PROBE_MS: Final = 1_000

Records = dict[TopicPartition, list[Any]]


def unreadable(exc: BaseException) -> bool:
    """Whether a fetch failed for good: a Kafka error that says so, or any non-Kafka
    exception out of ``getmany`` (a codec library's own error while decompressing)."""
    return isinstance(exc, _FOR_GOOD) or (
        isinstance(exc, Exception) and not isinstance(exc, KafkaError)
    )


class GuardedFetch:
    """``getmany`` on ``consumer`` that isolates and reports a partition it cannot read.

    ``on_unreadable(topic, partition)`` is told of each report (the metric).
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        *,
        name: str,
        health: HealthBoard | None = None,
        on_unreadable: Callable[[str, int], None] | None = None,
        retry_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._consumer = consumer
        self._name = name
        self._health = health
        self._on_unreadable = on_unreadable
        self._retry_s = retry_s
        self._clock = clock
        #: The offset after the last record returned to the caller, per partition.
        self._next: dict[TopicPartition, int] = {}
        #: Partitions paused here, with when to try them again.
        self._paused: dict[TopicPartition, float] = {}
        #: Partitions tried again whose report stands until they read.
        self._retrying: set[TopicPartition] = set()
        #: Partitions held by the caller (``hold``), with when to read them again.
        self._held: dict[TopicPartition, float] = {}

    @property
    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def hold(self, tp: TopicPartition, offset: int, retry_s: float) -> None:
        """Reads ``tp`` again from ``offset``, not before ``retry_s`` from now; the other
        partitions go on meanwhile. Nothing for a partition no longer assigned."""
        if tp not in self._consumer.assignment():
            return
        self._consumer.seek(tp, offset)
        self._consumer.pause(tp)
        self._next[tp] = offset
        self._held[tp] = self._clock() + retry_s

    async def getmany(self, *, timeout_ms: int, max_records: int) -> Records:
        if self._held:
            self._resume_held()
        if self._paused:
            self._retry_due()
        try:
            batch: Records = await self._consumer.getmany(
                timeout_ms=timeout_ms, max_records=max_records
            )
        except Exception as exc:
            if not unreadable(exc):
                raise
            return await self._isolate(exc, max_records)
        self._note(batch)
        return batch

    def _note(self, batch: Records) -> None:
        for tp, records in batch.items():
            if records:
                self._next[tp] = records[-1].offset + 1
                if tp in self._retrying:
                    self._retrying.discard(tp)
                    self._clear(tp)
                    log.info("%s: %s[%d] reads again", self._name, tp.topic, tp.partition)

    async def _isolate(self, exc: BaseException, max_records: int) -> Records:
        consumer = self._consumer
        live = sorted(set(consumer.assignment()) - consumer.paused())
        # aiokafka moved the other partitions past what this failed call drained and
        # dropped: read them again from the caller's last record.
        for tp in live:
            await self._rewind(tp)
        found: Records = {}
        culprit = False
        for tp in live:
            start = await consumer.position(tp)
            try:
                got = await consumer.getmany(tp, timeout_ms=_PROBE_MS, max_records=max_records)
            except Exception as one:
                if not unreadable(one):
                    raise
                self._pause(tp, start, one)
                culprit = True
                continue
            if got.get(tp):
                found[tp] = got[tp]
        if not culprit:
            log.warning(
                "%s: a fetch failed for good (%r) but no partition failed alone yet; "
                "looking again at the next fetch",
                self._name,
                exc,
            )
        self._note(found)
        return found

    async def _rewind(self, tp: TopicPartition) -> None:
        consumer = self._consumer
        offset = self._next.get(tp)
        if offset is None:
            # Nothing returned since it was assigned: it started at its committed offset
            # (or at the beginning, auto_offset_reset being "earliest" for every consumer).
            offset = await consumer.committed(tp)
        if offset is None:
            await consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, offset)

    def _pause(self, tp: TopicPartition, offset: int, exc: BaseException) -> None:
        self._consumer.pause(tp)
        self._paused[tp] = self._clock() + self._retry_s
        self._retrying.discard(tp)
        log.error(
            "%s: cannot read %s[%d] at offset %d: %r. Retrying cannot cure this (a "
            "compression codec this process lacks, or a corrupt batch): the partition is "
            "paused, its records wait, the others go on; tried again every %.0fs. See "
            "'Compressed records' in docs/operations.md",
            self._name,
            tp.topic,
            tp.partition,
            offset,
            exc,
            self._retry_s,
        )
        if self._on_unreadable is not None:
            self._on_unreadable(tp.topic, tp.partition)
        if self._health is not None:
            self._health.report(
                self._key(tp),
                f"{self._name}: cannot read {tp.topic}[{tp.partition}] at offset {offset} "
                f"({type(exc).__name__}: {exc}); the partition is paused",
            )

    def _retry_due(self) -> None:
        now = self._clock()
        assigned = self._consumer.assignment()
        for tp, due in list(self._paused.items()):
            if tp not in assigned:
                # Revoked: its next owner reads (and reports) it.
                del self._paused[tp]
                self._clear(tp)
            elif due <= now:
                del self._paused[tp]
                self._retrying.add(tp)
                self._consumer.resume(tp)

    def _resume_held(self) -> None:
        now = self._clock()
        assigned = self._consumer.assignment()
        for tp, due in list(self._held.items()):
            if tp not in assigned:
                del self._held[tp]  # revoked: its next owner reads it from the commit
            elif due <= now:
                del self._held[tp]
                self._consumer.resume(tp)

    def forget(self, revoked: Iterable[TopicPartition]) -> None:
        """Drops what is known of partitions given up (their next owner reports them)."""
        for tp in revoked:
            self._next.pop(tp, None)
            self._held.pop(tp, None)
            self._paused.pop(tp, None)
            self._retrying.discard(tp)
            self._clear(tp)

    def _key(self, tp: TopicPartition) -> str:
        return f"unreadable:{self._name}:{tp.topic}[{tp.partition}]"

    def _clear(self, tp: TopicPartition) -> None:
        if self._health is not None:
            self._health.clear(self._key(tp))
