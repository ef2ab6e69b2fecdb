"""Each group consumer has a sticky assignor of its own: what one was assigned is not
what another claims at the next rebalance (aiokafka keeps it on the class)."""

from __future__ import annotations

from aiokafka.coordinator.assignors.sticky.sticky_assignor import (
    StickyAssignorUserDataV1,
    StickyPartitionAssignor,
)
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.structs import TopicPartition

from saga_engine.kernel._settings import KafkaSettings
from saga_engine.transport._kafka import make_group_consumer, own_sticky_assignor


def _claimed(assignor: type[StickyPartitionAssignor]) -> list[TopicPartition]:
    user_data = assignor.metadata(["t.inbox"]).user_data
    if not user_data:
        return []
    decoded = StickyAssignorUserDataV1.decode(user_data)
    return [TopicPartition(topic, p) for topic, ps in decoded.previous_assignment for p in ps]


def test_what_one_consumer_was_assigned_is_not_claimed_by_another() -> None:
    first, second = own_sticky_assignor(), own_sticky_assignor()
    first.on_assignment(ConsumerProtocolMemberAssignment(0, [("t.inbox", [0, 1])], b""))
    assert _claimed(first) == [TopicPartition("t.inbox", 0), TopicPartition("t.inbox", 1)]
    assert _claimed(second) == []
    assert _claimed(StickyPartitionAssignor) == []
    assert first.name == second.name == "sticky"  # one protocol: one group with any release


async def test_each_group_consumer_gets_its_own() -> None:
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:9")
    consumers = [
        make_group_consumer(kafka, group_id="g", client_id=f"c{i}", instance_name=None)
        for i in range(2)
    ]
    # aiokafka keeps the strategy it was given; nothing public reads it back.
    [a], [b] = (c._partition_assignment_strategy for c in consumers)
    assert a is not b
    assert issubclass(a, StickyPartitionAssignor)
    assert issubclass(b, StickyPartitionAssignor)
    for consumer in consumers:
        await consumer.stop()  # never started: nothing to leave
