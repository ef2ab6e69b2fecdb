"""The kernel's partitioner agrees with the one Kafka's clients use (aiokafka's murmur2):
a saga's stored ``key_hash`` and the engine's ownership test depend on it."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner, murmur2
from hypothesis import given
from hypothesis import strategies as st

from saga_engine.kernel._partitioning import key_hash, key_partition, partition_for
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


@given(st.binary(min_size=1, max_size=64), st.integers(min_value=1, max_value=64))
def test_the_producers_partitioner_is_the_default_one(key: bytes, count: int) -> None:
    # Partition numbers that are not their indexes, so an index returned for a number fails.
    partitions = [p * 3 + 1 for p in range(count)]
    expected = DefaultPartitioner()(key, partitions, partitions[:1])
    assert key_partition(key, partitions, partitions[:1]) == expected
    assert key_partition(key, partitions, partitions[:1]) == expected  # and from the cache


def test_a_record_without_a_key_goes_to_an_available_partition() -> None:
    assert {key_partition(None, [0, 1, 2, 3], [2]) for _ in range(20)} == {2}
    assert {key_partition(None, [0, 1], []) for _ in range(50)} <= {0, 1}


@given(st.text(max_size=40), st.integers(min_value=1, max_value=64))
def test_a_text_keys_bytes_go_where_the_text_does(key: str, count: int) -> None:
    # A UTF-8 key's hash is taken from the text's (key_hash), cached or not.
    partitions = list(range(count))
    encoded = key.encode()
    expected = DefaultPartitioner()(encoded, partitions, partitions)
    assert key_partition(encoded, partitions, partitions) == expected
    assert partition_for(key, count) == expected
