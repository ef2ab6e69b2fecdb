"""One contract for both command-bus adapters: Kafka (aiokafka) and in memory.

A sent command reaches its participant's channel intact, in the order sent for a saga,
and a closed bus refuses to send with a TransientError.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from saga_engine import OutboundCommand, TransientError
from saga_engine.settings import KafkaSettings
from saga_engine.testing import InMemoryCommandBus
from saga_engine.transport._kafka import KafkaCommandSender, ensure_topics, make_producer
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import decode
from tests.integration.kafka_helpers import read_topic


@dataclass
class Bus:
    send: Callable[[OutboundCommand], Awaitable[None]]
    received: Callable[[str, int], Awaitable[list[OutboundCommand]]]
    close: Callable[[], Awaitable[None]]


@pytest.fixture(params=["memory", "kafka"])
async def bus(request: pytest.FixtureRequest, unique_id: str) -> AsyncIterator[Bus]:
    if request.param == "memory":
        memory = InMemoryCommandBus()

        async def received_memory(participant: str, count: int) -> list[OutboundCommand]:
            return [c for c in memory.sent if c.participant == participant][:count]

        async def close_memory() -> None:
            memory.closed = True

        yield Bus(memory.send_command, received_memory, close_memory)
        return
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    kafka = KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=f"t{unique_id}", partitions=2)
    topics = Topics.of(kafka)
    await ensure_topics(kafka, [topics.commands("alpha"), topics.commands("beta")])
    producer = make_producer(kafka)
    await producer.start()
    sender = KafkaCommandSender(producer, topics, "/contract")

    async def received_kafka(participant: str, count: int) -> list[OutboundCommand]:
        records = await read_topic(kafka, topics.commands(participant), count)
        out = []
        for r in records:
            env = decode(r.key, r.value, list(r.headers), max_bytes=kafka.max_message_bytes)
            out.append(
                OutboundCommand(
                    saga_id=env.saga_id,
                    saga_type=env.saga_type,
                    step=env.step,
                    participant=participant,
                    command_type=env.subject,
                    payload=env.body,
                    command_id=env.command_id,
                    attempt=0,
                    compensation=env.compensation,
                    compensates=tuple(i for i in env.compensates.split(",") if i),
                )
            )
        return out

    closed = False

    async def close_kafka() -> None:
        nonlocal closed
        closed = True
        await producer.stop()

    yield Bus(sender.send_command, received_kafka, close_kafka)
    if not closed:
        await producer.stop()


def _command(
    saga_id: str,
    n: int,
    participant: str = "alpha",
    *,
    compensation: bool = False,
    compensates: tuple[str, ...] = (),
) -> OutboundCommand:
    return OutboundCommand(
        saga_id=saga_id,
        saga_type="demo",
        step=f"step-{n}",
        participant=participant,
        command_type="Reserve",
        payload={"n": n, "text": "é✓"},
        command_id=str(uuid.uuid4()),
        attempt=0,
        compensation=compensation,
        compensates=compensates,
    )


def _essentials(c: OutboundCommand) -> tuple[object, ...]:
    return (
        c.saga_id,
        c.step,
        c.command_type,
        c.payload,
        c.command_id,
        c.compensation,
        c.compensates,
    )


async def test_commands_arrive_intact_and_in_order_per_saga(bus: Bus) -> None:
    saga = str(uuid.uuid4())
    sent = [_command(saga, n) for n in range(5)]
    sent.append(_command(saga, 9, compensation=True, compensates=(sent[0].command_id,)))
    for command in sent:
        await bus.send(command)
    got = await bus.received("alpha", len(sent))
    assert [_essentials(c) for c in got] == [_essentials(c) for c in sent]


async def test_commands_go_only_to_their_participant(bus: Bus) -> None:
    saga = str(uuid.uuid4())
    await bus.send(_command(saga, 1, participant="beta"))
    await bus.send(_command(saga, 2, participant="alpha"))
    assert [c.step for c in await bus.received("beta", 1)] == ["step-1"]
    assert [c.step for c in await bus.received("alpha", 1)] == ["step-2"]


async def test_a_closed_bus_refuses_with_a_transient_error(bus: Bus) -> None:
    await bus.close()
    with pytest.raises(TransientError):
        await bus.send(_command(str(uuid.uuid4()), 1))
