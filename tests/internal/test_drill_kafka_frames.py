"""The drill's Kafka link proxy reads the brokers' answers: every broker address in a
Metadata or FindCoordinator answer is rewritten (nothing else changes), the versions an
ApiVersions answer offers for those two requests are capped to the ones it reads, and an
answer it cannot read is refused, naming it. The answers are encoded by aiokafka's own
protocol classes, as a broker's are read by it."""

from __future__ import annotations

import struct

import pytest
from aiokafka.protocol.admin import ApiVersionResponse_v0, ApiVersionResponse_v1
from aiokafka.protocol.coordination import FindCoordinatorResponse_v0, FindCoordinatorResponse_v1
from aiokafka.protocol.metadata import (
    MetadataResponse_v0,
    MetadataResponse_v1,
    MetadataResponse_v2,
    MetadataResponse_v3,
    MetadataResponse_v4,
    MetadataResponse_v5,
)
from aiokafka.protocol.struct import Struct

from saga_engine.cli._drill_kafka import (
    API_VERSIONS,
    CAPS,
    FIND_COORDINATOR,
    METADATA,
    KafkaProtocolError,
    broker_addresses,
    cap_versions,
    rewrite,
)

_BROKERS = [(1, "kafka-1.example", 9092), (2, "10.0.0.2", 19092)]
_PROXIED = {("kafka-1.example", 9092): 40001, ("10.0.0.2", 19092): 40002}


def _to_proxy(address: tuple[str, int]) -> tuple[str, int]:
    return "127.0.0.1", _PROXIED[address]


def _partitions(version: int) -> list[tuple[object, ...]]:
    if version >= 5:
        return [(0, 0, 1, [1, 2], [1, 2], [])]
    return [(0, 0, 1, [1, 2], [1, 2])]


def _metadata(version: int) -> Struct:
    parts = _partitions(version)
    if version == 0:
        return MetadataResponse_v0(_BROKERS, [(0, "orders", parts)])
    brokers = [(n, h, p, "rack-a" if n == 1 else None) for n, h, p in _BROKERS]
    topics = [(0, "orders", False, parts)]
    if version == 1:
        return MetadataResponse_v1(brokers, 1, topics)
    if version == 2:
        return MetadataResponse_v2(brokers, "cluster-x", 1, topics)
    classes = {3: MetadataResponse_v3, 4: MetadataResponse_v4, 5: MetadataResponse_v5}
    built: Struct = classes[version](0, brokers, "cluster-x", 1, topics)
    return built


@pytest.mark.parametrize("version", range(6))
def test_every_broker_of_a_metadata_answer_is_rewritten_and_nothing_else(version: int) -> None:
    answer = _metadata(version)
    body = answer.encode()
    assert broker_addresses(METADATA, version, body) == [(h, p) for _, h, p in _BROKERS]
    rewritten = type(answer).decode(rewrite(METADATA, version, body, _to_proxy))
    assert [(b[0], b[1], b[2]) for b in rewritten.brokers] == [
        (1, "127.0.0.1", 40001),
        (2, "127.0.0.1", 40002),
    ]
    assert rewritten.topics == answer.topics
    if version >= 1:
        assert [b[3] for b in rewritten.brokers] == ["rack-a", None]


@pytest.mark.parametrize(
    "answer",
    [
        FindCoordinatorResponse_v0(0, 1, "kafka-1.example", 9092),
        FindCoordinatorResponse_v1(0, 0, None, 1, "kafka-1.example", 9092),
    ],
)
def test_a_coordinator_answer_is_rewritten(answer: Struct) -> None:
    version = answer.API_VERSION
    rewritten = type(answer).decode(rewrite(FIND_COORDINATOR, version, answer.encode(), _to_proxy))
    assert (rewritten.coordinator_id, rewritten.host, rewritten.port) == (1, "127.0.0.1", 40001)


def test_a_coordinator_error_names_no_broker_and_is_passed_on_as_it_is() -> None:
    answer = FindCoordinatorResponse_v1(0, 15, "not available", -1, "", -1).encode()
    assert broker_addresses(FIND_COORDINATOR, 1, answer) == []
    assert rewrite(FIND_COORDINATOR, 1, answer, _to_proxy) == answer


def test_versions_past_the_caps_are_refused_naming_them() -> None:
    body = _metadata(5).encode()
    # Versions 6 to 8 begin as 5 does: the brokers come before anything they added.
    assert broker_addresses(METADATA, CAPS[METADATA], body) == [(h, p) for _, h, p in _BROKERS]
    with pytest.raises(KafkaProtocolError, match=r"api 3 v9 \(the proxy reads up to v8\)"):
        broker_addresses(METADATA, 9, body)
    with pytest.raises(KafkaProtocolError, match="truncated"):
        broker_addresses(METADATA, 5, body[:12])


_OFFERED = [(0, 3, 11), (METADATA, 0, 13), (FIND_COORDINATOR, 1, 6), (API_VERSIONS, 0, 4)]
_CAPPED = [(0, 3, 11), (METADATA, 0, 8), (FIND_COORDINATOR, 1, 2), (API_VERSIONS, 0, 4)]


def test_an_api_versions_answer_offers_only_what_the_proxy_reads() -> None:
    for version, answer in (
        (0, ApiVersionResponse_v0(0, _OFFERED)),
        (1, ApiVersionResponse_v1(0, _OFFERED, 0)),
    ):
        body = bytearray(answer.encode())
        cap_versions(version, body)
        assert type(answer).decode(bytes(body)).api_versions == _CAPPED


def _flexible(entries: list[tuple[int, int, int]], tagged: bytes) -> bytes:
    """An ApiVersions answer of version 3 or later (compact array, tagged fields), the
    first entry with a tagged field to skip; encoded by hand, as aiokafka has no class
    for it."""
    out = struct.pack(">hB", 0, len(entries) + 1)
    for n, (key, low, high) in enumerate(entries):
        out += struct.pack(">hhh", key, low, high)
        out += struct.pack(">BBB", 1, 3, len(tagged)) + tagged if n == 0 else b"\x00"
    return out + struct.pack(">iB", 0, 0)


def test_a_flexible_api_versions_answer_is_capped_too() -> None:
    body = bytearray(_flexible(_OFFERED, b"xyz"))
    cap_versions(4, body)
    assert bytes(body) == _flexible(_CAPPED, b"xyz")


def test_an_api_versions_error_is_left_alone() -> None:
    body = bytearray(struct.pack(">hi", 35, 0))
    cap_versions(3, body)
    assert bytes(body) == struct.pack(">hi", 35, 0)
