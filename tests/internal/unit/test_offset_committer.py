"""OffsetCommitter (saga_engine/transport/_kafka.py): background offset commits that never move a
partition back, skip partitions no longer owned, and never hold a stop hostage.

The consumer here is a stand-in that records what it is asked to commit: what is under
test is the committer's own ordering and bounds, not Kafka (the real-server tests in
tests/participant and tests/internal/e2e commit through it on every batch).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, TopicPartition

from saga_engine.transport._kafka import OffsetCommitter
from tests.waiting import eventually

P0 = TopicPartition("inbox", 0)
P1 = TopicPartition("inbox", 1)


class RecordingConsumer:
    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = False

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the group rebalanced")
        self.commits.append(dict(offsets))


def committer(
    consumer: RecordingConsumer, owned: set[TopicPartition], *, limit: float = 5.0
) -> OffsetCommitter:
    return OffsetCommitter(
        cast(AIOKafkaConsumer, cast(Any, consumer)), lambda: owned, flush_limit_s=limit
    )


async def test_commits_the_newest_offset_per_partition_one_commit_at_a_time() -> None:
    consumer = RecordingConsumer()
    consumer.gate.clear()  # the first commit hangs until released
    c = committer(consumer, {P0, P1})

    c.submit({P0: 10})
    await asyncio.sleep(0)  # the first commit is in flight, waiting on the gate
    c.submit({P0: 20, P1: 5})
    c.submit({P0: 15})  # older than what is pending: must not move P0 back
    consumer.gate.set()
    await c.flush()

    assert consumer.commits == [{P0: 10}, {P0: 20, P1: 5}]


async def test_skips_partitions_given_up_and_goes_on_after_a_failed_commit() -> None:
    consumer = RecordingConsumer()
    owned = {P0, P1}
    c = committer(consumer, owned)

    consumer.fail_next = True
    c.submit({P0: 3})
    await c.flush()
    owned.discard(P1)
    c.submit({P0: 4, P1: 9})
    await c.flush()

    # The failed commit is dropped (the next owner re-reads); P1 is no longer ours.
    assert consumer.commits == [{P0: 4}]


async def test_a_commit_that_never_returns_does_not_hold_the_flush() -> None:
    consumer = RecordingConsumer()
    consumer.gate.clear()  # the coordinator never answers
    c = committer(consumer, {P0, P1}, limit=0.2)

    c.submit({P0: 7})
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(c.flush(), timeout=5)

    assert loop.time() - started < 2
    assert consumer.commits == []
    # Dropped, as a crash would drop it: nothing is committed later either. Another
    # partition's offset, handed over once the coordinator answers, commits alone.
    consumer.gate.set()
    c.submit({P1: 8})
    await c.flush()
    assert consumer.commits == [{P1: 8}]


async def test_close_drops_what_is_pending() -> None:
    consumer = RecordingConsumer()
    consumer.gate.clear()
    c = committer(consumer, {P0, P1})

    c.submit({P0: 1})
    await asyncio.sleep(0)
    c.submit({P0: 2})
    await c.close()
    consumer.gate.set()
    c.submit({P1: 3})  # another partition's, after the close: it commits alone
    await c.flush()

    assert consumer.commits == [{P1: 3}]


def spaced_committer(
    consumer: RecordingConsumer, owned: set[TopicPartition], interval_s: float
) -> OffsetCommitter:
    return OffsetCommitter(
        cast(AIOKafkaConsumer, cast(Any, consumer)),
        lambda: owned,
        flush_limit_s=5.0,
        interval_s=interval_s,
    )


async def test_offsets_handed_over_within_the_interval_go_in_one_commit() -> None:
    consumer = RecordingConsumer()
    c = spaced_committer(consumer, {P0, P1}, interval_s=3600)

    c.submit({P0: 1})
    await eventually(lambda: consumer.commits == [{P0: 1}])
    # The next commit waits its turn (an hour here): the batches meanwhile pile up.
    c.submit({P0: 2})
    c.submit({P1: 4})
    c.submit({P0: 3})
    for _ in range(5):
        await asyncio.sleep(0)
    assert consumer.commits == [{P0: 1}]
    # A flush (a rebalance's revocation, a stop) does not wait for the turn.
    await asyncio.wait_for(c.flush(), timeout=5)
    assert consumer.commits == [{P0: 1}, {P0: 3, P1: 4}]


async def test_after_a_flush_commits_are_spaced_again() -> None:
    consumer = RecordingConsumer()
    c = spaced_committer(consumer, {P0}, interval_s=3600)

    c.submit({P0: 1})
    await c.flush()
    c.submit({P0: 2})
    for _ in range(5):
        await asyncio.sleep(0)
    assert consumer.commits == [{P0: 1}]
    await c.close()  # what waits its turn is dropped, as a crash would drop it
    assert consumer.commits == [{P0: 1}]
