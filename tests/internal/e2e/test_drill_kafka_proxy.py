"""The drill's Kafka link proxies against the real broker: each group's clients reach
Kafka only through their own proxy (the brokers they learn are its listeners), a cut of
one link drops and holds that group's connections while the other group's carry on,
aiokafka reconnects once the cut ends and what it sent during it arrives, a slow link
delivers late, and the versions the broker offers are capped to those the proxy reads."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from saga_engine.cli._drill_kafka import CAPS, FIND_COORDINATOR, METADATA, KafkaLinkProxy
from tests.conftest import TopicFactory
from tests.waiting import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
async def links(kafka_bootstrap: str) -> AsyncIterator[tuple[KafkaLinkProxy, KafkaLinkProxy]]:
    cut, spared = KafkaLinkProxy(kafka_bootstrap), KafkaLinkProxy(kafka_bootstrap)
    for proxy in (cut, spared):
        await proxy.start()
    try:
        yield cut, spared
    finally:
        for proxy in (cut, spared):
            await proxy.close()


def _ports(client: AIOKafkaProducer | AIOKafkaConsumer) -> set[tuple[str, int]]:
    """The broker addresses the client learned from the cluster's metadata."""
    inner = client.client if isinstance(client, AIOKafkaProducer) else client._client
    return {(b.host, b.port) for b in inner.cluster.brokers()}


def _listeners(proxy: KafkaLinkProxy) -> set[tuple[str, int]]:
    return {("127.0.0.1", port) for port in proxy._ports.values()}


async def test_a_cut_link_holds_its_group_spares_the_other_and_reconnects(
    links: tuple[KafkaLinkProxy, KafkaLinkProxy], kafka_topic: TopicFactory
) -> None:
    cut, spared = links
    topic = await kafka_topic("link", partitions=2)
    producer = AIOKafkaProducer(bootstrap_servers=cut.bootstrap_servers)
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=spared.bootstrap_servers,
        group_id=f"{topic}-group",
        auto_offset_reset="earliest",
    )
    await producer.start()
    await consumer.start()
    got: list[bytes] = []

    async def consume() -> None:
        async for record in consumer:
            got.append(record.value or b"")

    consuming = asyncio.create_task(consume())
    try:
        await producer.send_and_wait(topic, b"before")
        await eventually(lambda: got == [b"before"], what="the first record")
        # Nothing reaches the broker around the proxies.
        assert _ports(producer) == _listeners(cut), (_ports(producer), cut._ports)
        assert _ports(consumer) == _listeners(spared), (_ports(consumer), spared._ports)

        cutting = asyncio.create_task(cut.cut(12.0))
        await eventually(lambda: cut.stats.dropped, what="the cut's dropped connections")
        sending = asyncio.create_task(producer.send_and_wait(topic, b"during"))
        # The producer tries again during the cut: its new connection is held.
        await eventually(lambda: cut.stats.held, what="a connection held by the cut")
        if not cutting.done():  # the cut still holds: the record cannot have gone
            assert not sending.done()
        await cutting
        await asyncio.wait_for(sending, 60)
        await eventually(lambda: got == [b"before", b"during"], what="the record sent in the cut")
        assert cut.stats.forwarded_after_cut > 0, cut.stats
        # The consumer's link was never cut.
        assert (spared.stats.cuts, spared.stats.dropped, spared.stats.held) == (0, 0, 0)
    finally:
        consuming.cancel()
        await consumer.stop()
        await producer.stop()


async def test_a_slow_link_delivers_late_and_in_order(
    links: tuple[KafkaLinkProxy, KafkaLinkProxy], kafka_topic: TopicFactory
) -> None:
    slow, _ = links
    topic = await kafka_topic("slow")
    producer = AIOKafkaProducer(bootstrap_servers=slow.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"0")
        assert slow.stats.delayed == 0
        slowing = asyncio.create_task(slow.slow(0.2, 30.0))
        await eventually(lambda: slow.latency_s, what="the link slowed")
        sent = [await producer.send_and_wait(topic, b"%d" % n) for n in range(1, 4)]
        assert [r.offset for r in sent] == [1, 2, 3]
        # Each request and each answer came late (and the records in order, above).
        assert slow.stats.delayed >= 6, slow.stats
        slowing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await slowing
        assert slow.latency_s == 0
    finally:
        await producer.stop()


def _offered(address: tuple[str, int]) -> dict[int, int]:
    """The newest version of each request the listener at ``address`` offers: an
    ApiVersions request of version 3 (the flexible encoding), sent by hand."""
    client = b"drill-test"
    header = struct.pack(">hhih", 18, 3, 7, len(client)) + client + b"\x00"
    body = b"\x05saga\x021\x00"  # client software name and version, compact; no tags
    with socket.create_connection(address, timeout=30) as conn:
        conn.sendall(struct.pack(">i", len(header + body)) + header + body)
        stream = conn.makefile("rb")
        (size,) = struct.unpack(">i", stream.read(4))
        answer = stream.read(size)
    correlation, error, count = struct.unpack_from(">ihB", answer)
    assert (correlation, error) == (7, 0)
    assert count < 0x80  # one byte of varint: fewer than 127 requests
    newest = {}
    for n in range(count - 1):
        key, _, high, tags = struct.unpack_from(">hhhB", answer, 7 + 7 * n)
        assert tags == 0
        newest[key] = high
    return newest


async def test_the_proxy_offers_only_the_versions_it_reads(
    links: tuple[KafkaLinkProxy, KafkaLinkProxy], kafka_bootstrap: str
) -> None:
    proxy, _ = links
    host, _, port = kafka_bootstrap.partition(",")[0].rpartition(":")
    direct = await asyncio.to_thread(_offered, (host, int(port)))
    through = await asyncio.to_thread(_offered, ("127.0.0.1", proxy._ports[(host, int(port))]))
    # Kafka 4 offers newer ones (Metadata up to 13, FindCoordinator up to 6).
    assert direct[METADATA] > CAPS[METADATA], direct[METADATA]
    for key in (METADATA, FIND_COORDINATOR):
        assert through[key] == min(CAPS[key], direct[key]), (key, direct[key], through[key])
    assert {k: v for k, v in through.items() if k not in CAPS} == {
        k: v for k, v in direct.items() if k not in CAPS
    }
