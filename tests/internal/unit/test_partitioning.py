"""The kernel's partitioner agrees with the one Kafka's clients use (aiokafka's murmur2):
a saga's stored ``key_hash`` and the engine's ownership test depend on it."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner, murmur2
from hypothesis import given
from hypothesis import strategies as st

from saga_engine.kernel._partitioning import key_hash, partition_for
from saga_engine.kernel._partitioning import murmur2 as ours


@given(st.binary(max_size=64))
def test_murmur2_is_kafkas(data: bytes) -> None:
    assert ours(data) == murmur2(data)


@given(st.text(max_size=40), st.integers(min_value=1, max_value=512))
def test_partition_for_is_the_default_partitioners(key: str, partitions: int) -> None:
    encoded = key.encode()
    expected = DefaultPartitioner()(encoded, list(range(partitions)), list(range(partitions)))
    assert partition_for(key, partitions) == expected
    assert key_hash(key) == murmur2(encoded) & 0x7FFFFFFF


def test_a_known_value() -> None:
    # Kafka's own test vector (UtilsTest.testMurmur2): "21" hashes to -973932308 signed.
    assert ours(b"21") == -973932308 & 0xFFFFFFFF
