"""start_record (saga_engine/transport/_kafka.py): a record handed to the producer, its
acknowledgement returned as a future. With the topic's metadata known the send is handed
over as is; without, it waits for the metadata within SEND_TIMEOUT_S, then says Kafka is
unavailable.

The producer is a stand-in: what is under test is start_record's own paths, not
aiokafka (the real-server tests in tests/participant and tests/internal/e2e send
through it)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaProducer

from saga_engine.kernel._errors import KafkaUnavailable
from saga_engine.transport import _kafka


class Cluster:
    def __init__(self, known: set[str]) -> None:
        self.known = known

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return {0, 1} if topic in self.known else None


class Client:
    def __init__(self, known: set[str]) -> None:
        self.cluster = Cluster(known)


class StandInProducer:
    def __init__(self, known: set[str]) -> None:
        self.client = Client(known)
        self._closed = False
        self.sent: list[tuple[str, bytes]] = []
        self.deliveries: list[asyncio.Future[Any]] = []

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[Any]:
        if topic not in self.client.cluster.known:
            await asyncio.Event().wait()  # aiokafka waits for the topic's metadata
        self.sent.append((topic, value))
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery


def producer(known: set[str]) -> tuple[StandInProducer, AIOKafkaProducer]:
    stand_in = StandInProducer(known)
    return stand_in, cast(AIOKafkaProducer, cast(Any, stand_in))


async def test_a_known_topic_hands_the_record_over_and_returns_its_acknowledgement() -> None:
    stand_in, p = producer({"t"})
    ack = await _kafka.start_record(p, "t", b"k", b"v", [])
    assert stand_in.sent == [("t", b"v")]
    assert not ack.done()
    stand_in.deliveries[0].set_result("metadata")
    assert await ack == "metadata"


async def test_an_unknown_topic_waits_for_its_metadata_within_the_send_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_kafka, "SEND_TIMEOUT_S", 0.05)
    stand_in, p = producer(set())
    with pytest.raises(KafkaUnavailable, match=r"within 0\.05s"):
        await _kafka.start_record(p, "t", b"k", b"v", [])
    assert stand_in.sent == []


async def test_a_closed_producer_is_refused_at_once() -> None:
    stand_in, p = producer({"t"})
    stand_in._closed = True
    with pytest.raises(KafkaUnavailable, match="closed"):
        await _kafka.start_record(p, "t", b"k", b"v", [])


async def test_a_producer_without_a_cluster_hands_the_record_over() -> None:
    # The testing kit's and the benchmarks' in-memory producers have no metadata to
    # wait for.
    other, _ = producer({"t"})
    stand_in = Clusterless(other)
    ack = await _kafka.start_record(cast(AIOKafkaProducer, stand_in), "t", b"k", b"v", [])
    assert other.sent == [("t", b"v")]
    other.deliveries[0].set_result("metadata")
    assert await ack == "metadata"


class Clusterless:
    def __init__(self, inner: StandInProducer) -> None:
        self.send = inner.send
