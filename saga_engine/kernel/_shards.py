"""The shard map: which Postgres cluster holds the sagas of each inbox partition.

Past one database, the engine's store is divided by inbox partition: every saga belongs
to one partition (``partition_for(saga_id, partitions)``, Kafka's own partitioner), and
each partition's sagas live in one shard. A ``ShardMap`` says which shard holds each
partition, under an ``epoch`` that grows by one with every change; what is not per saga
(schedules, rollouts, batch operations, flow policies, the map itself) lives in one
control database.

The map is pure data: the shards' addresses (secrets) stay in the settings
(``PostgresSettings.shards``), and the map names shards only. It is written as text the
way an operator writes it (``"0-31,40"``), one home for reading and writing that text.
One shard (no ``SAGA_PG__SHARDS``) has no map at all and costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from saga_engine.kernel._errors import ShardMapError
from saga_engine.kernel._partitioning import partition_for

__all__ = ["ShardMap", "format_partitions", "parse_partitions"]

SHARD_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_partitions(text: str, partitions: int, *, shard: str = "") -> frozenset[int]:
    """The partitions a text names: ``"0-31"``, ``"0-31,40,48-63"``, or ``""`` for none.

    Raises ``ShardMapError`` naming the part it cannot read, or a partition outside
    ``0..partitions-1``."""
    where = f"shard {shard!r}: " if shard else ""
    out: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            if text.strip():
                raise ShardMapError(f"{where}empty range in partitions {text!r}")
            continue
        match = _RANGE.match(part)
        if match is None:
            raise ShardMapError(
                f"{where}cannot read {part.strip()!r} in partitions {text!r}: "
                "write ranges like '0-31' or single partitions like '40', separated by commas"
            )
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if low > high:
            raise ShardMapError(f"{where}range {part.strip()!r} ends before it starts")
        if high >= partitions:
            raise ShardMapError(
                f"{where}partition {high} does not exist: the inbox has {partitions} "
                f"partitions (0-{partitions - 1}, SAGA_KAFKA__PARTITIONS)"
            )
        out.update(range(low, high + 1))
    return frozenset(out)


def format_partitions(partitions: Iterable[int]) -> str:
    """The shortest text ``parse_partitions`` reads back as these partitions."""
    parts: list[str] = []
    run: list[int] = []
    for p in sorted(set(partitions)):
        if run and p == run[-1] + 1:
            run.append(p)
            continue
        if run:
            parts.append(_run_text(run))
        run = [p]
    if run:
        parts.append(_run_text(run))
    return ",".join(parts)


def _run_text(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


@dataclass(frozen=True, slots=True)
class ShardMap:
    """Which shard holds each inbox partition, at an epoch.

    ``owners[p]`` names the shard of partition ``p``; ``names`` lists every shard in the
    order the settings give them (a shard may hold no partition: a new one, before a
    range is moved to it). Build one with ``ShardMap.build``; it checks that every
    partition has exactly one shard."""

    epoch: int
    names: tuple[str, ...]
    owners: tuple[str, ...]

    @classmethod
    def build(cls, ranges: Mapping[str, str], partitions: int, *, epoch: int = 1) -> ShardMap:
        """A map from each shard's partitions as text (``{"a": "0-31", "b": "32-63"}``).

        Raises ``ShardMapError`` for a bad name, a partition held by two shards, or
        partitions no shard holds (naming them)."""
        if partitions < 1:
            raise ShardMapError(f"the inbox must have at least one partition, not {partitions}")
        if epoch < 1:
            raise ShardMapError(f"a shard map's epoch starts at 1, not {epoch}")
        if not ranges:
            raise ShardMapError("a shard map needs at least one shard")
        owners: dict[int, str] = {}
        for name, text in ranges.items():
            if not SHARD_NAME.match(name):
                raise ShardMapError(
                    f"shard name {name!r} is not valid: 1-40 characters of a-z, 0-9, '_' "
                    "and '-', starting with a letter or digit"
                )
            for p in sorted(parse_partitions(text, partitions, shard=name)):
                if p in owners:
                    raise ShardMapError(
                        f"partition {p} is given to two shards, {owners[p]!r} and {name!r}"
                    )
                owners[p] = name
        missing = [p for p in range(partitions) if p not in owners]
        if missing:
            raise ShardMapError(
                f"partitions {format_partitions(missing)} belong to no shard: every inbox "
                f"partition (0-{partitions - 1}) must be given to exactly one shard"
            )
        return cls(
            epoch=epoch, names=tuple(ranges), owners=tuple(owners[p] for p in range(partitions))
        )

    @property
    def partitions(self) -> int:
        """How many inbox partitions the map divides."""
        return len(self.owners)

    def shard_of_partition(self, partition: int) -> str:
        return self.owners[partition]

    def shard_of_saga(self, saga_id: str) -> str:
        """The shard a saga's history lives in: its inbox partition's."""
        return self.owners[partition_for(saga_id, len(self.owners))]

    def partitions_of(self, shard: str) -> frozenset[int]:
        return frozenset(p for p, owner in enumerate(self.owners) if owner == shard)

    def by_shard(self, partitions: Iterable[int]) -> dict[str, frozenset[int]]:
        """These partitions grouped by the shard that holds them (shards holding none of
        them are left out)."""
        out: dict[str, set[int]] = {}
        for p in partitions:
            out.setdefault(self.owners[p], set()).add(p)
        return {name: frozenset(ps) for name, ps in out.items()}

    def ranges(self) -> dict[str, str]:
        """Each shard's partitions as text, every shard named (``""`` for none)."""
        return {name: format_partitions(self.partitions_of(name)) for name in self.names}

    def moved(self, partitions: Iterable[int], to: str) -> ShardMap:
        """The map after ``partitions`` move to shard ``to``: the next epoch.

        Raises ``ShardMapError`` for an unknown shard, a partition that does not exist,
        or a move that changes nothing."""
        if to not in self.names:
            raise ShardMapError(f"no shard is named {to!r}; the shards are {', '.join(self.names)}")
        moving = set(partitions)
        outside = sorted(p for p in moving if not 0 <= p < len(self.owners))
        if outside:
            raise ShardMapError(
                f"partitions {format_partitions(outside)} do not exist: the inbox has "
                f"{len(self.owners)} partitions"
            )
        if not moving or all(self.owners[p] == to for p in moving):
            raise ShardMapError(
                f"partitions {format_partitions(moving) or '(none)'} are already on shard {to!r}"
            )
        owners = tuple(to if p in moving else owner for p, owner in enumerate(self.owners))
        return ShardMap(epoch=self.epoch + 1, names=self.names, owners=owners)

    def to_data(self) -> dict[str, Any]:
        """The map as JSON data, as the control database keeps it."""
        return {"epoch": self.epoch, "partitions": len(self.owners), "shards": self.ranges()}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ShardMap:
        """The map ``to_data`` wrote (checked as ``build`` checks it)."""
        try:
            shards = data["shards"]
            partitions = int(data["partitions"])
            epoch = int(data["epoch"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardMapError(f"a stored shard map is not readable: {exc!r}") from exc
        if not isinstance(shards, Mapping):
            raise ShardMapError("a stored shard map's 'shards' is not an object")
        return cls.build({str(k): str(v) for k, v in shards.items()}, partitions, epoch=epoch)
