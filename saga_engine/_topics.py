"""Topic names and partitioning, shared by the engine, the participants and the client."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from saga_engine._settings import KafkaSettings


@dataclass(frozen=True, slots=True)
class Topics:
    """``{prefix}.inbox`` carries replies, start requests, signals and cancels for the
    engines; ``{prefix}.cmd.{participant}`` carries each participant's commands;
    ``{prefix}.dlq`` receives what cannot be processed, with the reason in a header."""

    prefix: str

    @classmethod
    def of(cls, kafka: KafkaSettings) -> Topics:
        return cls(kafka.topic_prefix)

    @property
    def inbox(self) -> str:
        return f"{self.prefix}.inbox"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}.dlq"

    def commands(self, participant: str) -> str:
        return f"{self.prefix}.cmd.{participant}"

    def engine_group(self, group_id: str) -> str:
        return group_id

    def participant_group(self, participant: str) -> str:
        return f"{self.prefix}.participant.{participant}"


def key_hash(key: str) -> int:
    """The non-negative murmur2 hash Kafka's default partitioner takes a partition from:
    ``partition = key_hash(key) % partitions``. Stored with each saga (``sagas.key_hash``)
    so that "the sagas of these partitions" is a query."""
    from aiokafka.partitioner import murmur2

    return int(murmur2(key.encode()) & 0x7FFFFFFF)


# Asked for every input an engine applies (does it own the saga?); murmur2 is pure Python.
@functools.lru_cache(maxsize=65536)
def partition_for(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2) puts ``key`` in."""
    return key_hash(key) % partitions
