"""Which Kafka partition a key lands in: Kafka's default partitioner, pure.

The store keeps each saga's ``key_hash`` so that "the open sagas of these partitions" is
a query, and the engine asks ``partition_for`` of every input to know whether it owns the
saga; both must agree with the partitioner the producers use (murmur2 of the key's UTF-8
bytes, as ``org.apache.kafka.common.utils.Utils.murmur2``). It lives in the kernel, without
aiokafka, because the store and the transport both need it and neither may import the
other; a test checks it against aiokafka's partitioner.
"""

from __future__ import annotations

import functools
import random
import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit MurmurHash2 (seed 0x9747b28c) of ``data``, as an unsigned int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length >> 2
    # The 4-byte words, little-endian, read at once; each mixed in as Java's loop does
    # (k *= m; k ^= k >>> 24; k *= m; h *= m; h ^= k), with only the masks that change
    # the result: the low 32 bits of a product or xor depend only on the operands' low
    # 32 bits, so k's second product and h's product are masked once, after the xor.
    for k in _words(whole).unpack_from(data):
        k = (k * _M) & _MASK
        h = (h * _M ^ (k ^ k >> 24) * _M) & _MASK
    tail = data[whole << 2 :]
    if tail:
        # The trailing 1-3 bytes, little-endian, mixed in once (Java's switch fall-through).
        h ^= int.from_bytes(tail, "little")
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


@functools.lru_cache(maxsize=256)
def _words(count: int) -> struct.Struct:
    """The layout of ``count`` unsigned 32-bit little-endian words (one per key length:
    a saga id's is always the same)."""
    return struct.Struct(f"<{count}I")


# Cached: one saga's key is hashed for its creation, for every input (ownership) and for
# every record a producer sends for it (``key_partition``), each time the same id.
@functools.lru_cache(maxsize=65536)
def key_hash(key: str) -> int:
    """The non-negative murmur2 hash Kafka's default partitioner takes a partition from:
    ``partition = key_hash(key) % partitions``. Stored with each saga (``sagas.key_hash``)
    so that "the sagas of these partitions" is a query."""
    return murmur2(key.encode()) & 0x7FFFFFFF


@functools.lru_cache(maxsize=65536)
def _bytes_hash(key: bytes) -> int:
    # A UTF-8 key is the text's own bytes (decoding and encoding again gives them back):
    # its hash is the text's, which the engine cached when it asked whom the saga's
    # partition is (``partition_for``) before it sends the saga's records.
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return murmur2(key) & 0x7FFFFFFF
    return key_hash(text)


def key_partition(key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
    """Kafka's default partitioner as a producer calls it (aiokafka's ``partitioner``
    signature), with the hash of a key it saw before remembered: every record of a saga is
    keyed by its id. A record without a key goes to a random partition, as by default."""
    if key is None:
        return random.choice(available or all_partitions)
    return all_partitions[_bytes_hash(key) % len(all_partitions)]


# Asked for every input an engine applies (does it own the saga?).
@functools.lru_cache(maxsize=65536)
def partition_for(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2) puts ``key`` in."""
    return key_hash(key) % partitions
