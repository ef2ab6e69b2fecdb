"""The dead-letter topic (``{prefix}.dlq``) read and replayed by an operator: the CLI's
``saga dlq list|replay`` and the admin API's ``/dead-letters`` both go through here.

Reads use no consumer group (nothing is committed, no engine's group is joined) and a
deadline: an operator's look must not hang on a broker that is away. A dead letter is
decoded into a :class:`DeadLetter` (the ``dlq_*`` headers the engine and the participants
write, see ``DeadLetterPublisher.publish``); replaying one re-publishes its key, value
and headers, without the ``dlq_*`` ones, to its origin topic, or to the inbox addressed
to another saga (key and ``ce_sagaid`` set to it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from saga_engine.kernel._errors import (
    DeadLetterNotFound,
    DeadLetterNotReplayable,
    DeadLetterTopicUnavailable,
)
from saga_engine.kernel._settings import KafkaSettings
from saga_engine.transport._dead_letter import DeadLetter, Replayed
from saga_engine.transport._kafka import make_consumer, make_producer
from saga_engine.transport._topics import Topics

__all__ = ["DeadLetterTopic"]


def _letter(record: Any) -> DeadLetter:
    return DeadLetter(
        partition=record.partition,
        offset=record.offset,
        timestamp=datetime.fromtimestamp(record.timestamp / 1000, UTC),
        key=record.key,
        value=record.value,
        headers=tuple((k, bytes(v)) for k, v in record.headers or ()),
    )


class DeadLetterTopic:
    """The dead-letter topic of ``kafka``'s prefix, for an operator's reads and replays
    (the Kafka adapter of the ``DeadLetters`` port)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka
        self._topic = Topics.of(kafka).dlq

    @property
    def topic(self) -> str:
        return self._topic

    async def newest(
        self,
        limit: int | None,
        seconds: float,
        *,
        match: Callable[[DeadLetter], bool] | None = None,
        scan: int | None = None,
    ) -> list[DeadLetter]:
        """The newest ``limit`` dead letters (all with None) that ``match``, oldest first.

        Reads the newest ``scan`` records of each partition (``limit`` when None: the
        newest ``limit`` overall are among them); a filter scans further back than it
        shows. Raises DeadLetterTopicUnavailable when the topic does not exist or
        ``seconds`` pass first."""
        back = scan if scan is not None else limit
        async with self._reading(seconds) as (consumer, tps):
            letters = await self._read(consumer, tps, back)
        if match is not None:
            letters = [d for d in letters if match(d)]
        letters.sort(key=lambda d: (d.timestamp, d.partition, d.offset))
        return letters if limit is None else letters[-limit:] if limit else []

    async def get(self, partition: int, offset: int, seconds: float) -> DeadLetter:
        """The dead letter at ``offset`` of ``partition``; DeadLetterNotFound if none."""
        async with self._reading(seconds) as (consumer, tps):
            tp = TopicPartition(self.topic, partition)
            if tp not in tps:
                raise DeadLetterNotFound(self.topic, partition, offset)
            consumer.assign([tp])
            first = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            if not first <= offset < end:
                raise DeadLetterNotFound(self.topic, partition, offset)
            consumer.seek(tp, offset)
            record = await consumer.getone(tp)
        # Offsets of transaction markers hold no record: the next one is another letter.
        if record.offset != offset:
            raise DeadLetterNotFound(self.topic, partition, offset)
        return _letter(record)

    async def replay(
        self, letter: DeadLetter, seconds: float, *, to_saga: str | None = None
    ) -> Replayed:
        """Re-publishes ``letter`` without its ``dlq_*`` headers: to its origin topic, or
        with ``to_saga`` to the inbox with its key and ``ce_sagaid`` set to that saga.

        Raises DeadLetterNotReplayable when it names no origin (and no saga is given) or
        names the dead-letter topic itself."""
        headers = [(k, v) for k, v in letter.headers if not k.startswith("dlq_")]
        key = letter.key
        if to_saga is not None:
            topic = Topics.of(self.kafka).inbox
            key = to_saga.encode()
            headers = [(k, v) for k, v in headers if k != "ce_sagaid"]
            headers.append(("ce_sagaid", to_saga.encode()))
        else:
            topic = letter.origin_topic
            if not topic:
                raise DeadLetterNotReplayable(
                    "the record has no dlq_topic header: replay it to a saga instead"
                )
        if topic == self.topic:
            raise DeadLetterNotReplayable(f"the record's origin is {topic} itself")
        producer = make_producer(self.kafka)
        await producer.start()
        try:
            sent = await asyncio.wait_for(
                producer.send_and_wait(topic, letter.value, key=key, headers=headers), seconds
            )
        except TimeoutError:
            raise DeadLetterTopicUnavailable(
                f"timed out sending to {topic} after {seconds}s"
            ) from None
        finally:
            await producer.stop()
        return Replayed(
            letter.partition,
            letter.offset,
            topic,
            sent.partition,
            sent.offset,
            to_saga or letter.saga_id,
        )

    @asynccontextmanager
    async def _reading(
        self, seconds: float
    ) -> AsyncIterator[tuple[AIOKafkaConsumer, list[TopicPartition]]]:
        """A started consumer of no group and the topic's partitions, for a read that must
        end within ``seconds`` (DeadLetterTopicUnavailable if it does not)."""
        # The size limits of every consumer: a dead letter is as large as the record it keeps.
        consumer = make_consumer(self.kafka, group_id=None, fetch_max_wait_ms=50)
        await consumer.start()
        try:
            async with asyncio.timeout(seconds):
                yield consumer, await self._partitions(consumer)
        except TimeoutError:
            raise DeadLetterTopicUnavailable(
                f"timed out reading {self.topic} after {seconds}s"
            ) from None
        finally:
            await consumer.stop()

    async def _partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        # aiokafka has no public call for one topic's partitions without subscribing.
        cluster = await consumer._client.fetch_all_metadata()
        partitions = cluster.partitions_for_topic(self.topic)
        if not partitions:
            raise DeadLetterTopicUnavailable(f"the dead-letter topic {self.topic} does not exist")
        return [TopicPartition(self.topic, p) for p in sorted(partitions)]

    async def _read(
        self, consumer: AIOKafkaConsumer, tps: list[TopicPartition], back: int | None
    ) -> list[DeadLetter]:
        """Each partition's newest ``back`` records (all with None) up to its end now."""
        consumer.assign(tps)
        firsts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            start = firsts[tp] if back is None else max(firsts[tp], ends[tp] - back)
            consumer.seek(tp, start)
        letters: list[DeadLetter] = []
        remaining = {tp for tp in tps if ends[tp] > firsts[tp]}
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=200)
            for tp, records in batch.items():
                letters.extend(_letter(r) for r in records if r.offset < ends[tp])
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        return letters
