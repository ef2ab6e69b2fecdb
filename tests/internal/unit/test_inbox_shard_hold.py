"""An inbox record whose saga's range is moving to another shard holds only its partition.

The store refuses a write of a moving range with ``StaleShardMap`` until the move's commit
point. The inbox must not retry it in place (that would hold the whole batch, so every
other shard's sagas, for as long as the move pauses the range): the record's partition is
read again from it, and the batch's other partitions are applied and committed.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from saga_engine import Settings
from saga_engine.kernel._errors import StaleShardMap
from saga_engine.runner._path_inputs import Deliver, Input, InputOutcome
from saga_engine.transport._wire import CancelBody, Envelope, MessageType, encode
from saga_engine.worker._inbox import Inbox

MOVING = TopicPartition("saga.inbox", 0)
OTHER = TopicPartition("saga.inbox", 1)


class MovingRangeEngine:
    """Applies cancels; refuses the sagas of a moving range as the fenced store does."""

    def __init__(self, moving: set[str]) -> None:
        self.moving = moving
        self.applied: list[str] = []
        self.refused: list[str] = []

    def cancel_input(self, reason: str, *, principal: str) -> str:
        return reason

    async def apply(self, items: list[Input]) -> list[InputOutcome]:
        outcomes = []
        for item in items:
            assert isinstance(item, Deliver)
            if item.saga_id in self.moving:
                self.refused.append(item.saga_id)
                error = StaleShardMap(item.saga_id, "a", MOVING.partition, moving=True)
                outcomes.append(InputOutcome(error=error))
            else:
                self.applied.append(item.saga_id)
                outcomes.append(InputOutcome())
        return outcomes


def record(tp: TopicPartition, offset: int, saga_id: str) -> Any:
    envelope = Envelope(
        message_type=MessageType.CANCEL,
        source="/test",
        saga_id=saga_id,
        body=CancelBody(reason=f"cancel {offset}").model_dump(),
    )
    key, value, headers = encode(envelope)
    return SimpleNamespace(
        topic=tp.topic, partition=tp.partition, offset=offset, key=key, value=value, headers=headers
    )


def inbox(engine: MovingRangeEngine) -> Inbox:
    return Inbox(
        engine=engine,  # type: ignore[arg-type]
        children=None,  # type: ignore[arg-type]
        settings=Settings(),
        codec=None,
        dead=None,  # type: ignore[arg-type]
        instance_id="engine-1",
        owned=lambda: {MOVING, OTHER},
        running=lambda: True,
        on_dead_letter=lambda reason: None,
    )


async def test_a_moving_range_holds_its_partition_and_the_others_are_committed() -> None:
    engine = MovingRangeEngine(moving={"s-moving"})
    batch = {
        MOVING: [record(MOVING, 10, "s-moving"), record(MOVING, 11, "s-moving")],
        OTHER: [record(OTHER, 20, "s-1"), record(OTHER, 21, "s-2")],
    }
    consumer = inbox(engine)

    # A deadline far above a batch without I/O: an inbox that retried the record in place
    # would not return while the range stays paused.
    offsets = await asyncio.wait_for(consumer.process(batch), timeout=60)

    # The other partition's records were applied and are committed past them; the moving
    # range's partition is committed up to its first record, which is read again.
    assert engine.applied == ["s-1", "s-2"]
    assert offsets == {MOVING: 10, OTHER: 22}
    assert consumer.held == {MOVING: 10}
    # Asked once each, not retried in place while the range stays paused.
    assert engine.refused == ["s-moving", "s-moving"]

    # The move reached its commit point: the records read again go through.
    engine.moving.clear()
    again = await consumer.process({MOVING: batch[MOVING]})

    assert again == {MOVING: 12}
    assert consumer.held == {}
    assert engine.applied == ["s-1", "s-2", "s-moving", "s-moving"]
