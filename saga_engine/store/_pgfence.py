"""The fence of a sharded store (issue 43; migration 0024): which inbox partitions a
shard accepts writes for, checked by every group commit of a shard's store.

**The check.** A shard's ``PostgresEventStore`` opened with a ``ShardFence`` reads the
states of its batch's distinct partitions (``partition_for(saga_id, partitions)``) from
``shard_partitions`` in the batch's transaction, before the guard: one statement per
batch. A create or an append whose partition has no row (the writer routed by a map
older than a move) or a row in state ``'moving'`` (a move under way) fails alone with
``StaleShardMap``; the rest of the batch commits. The read takes ACCESS SHARE on the
table until the batch commits, so a move's ``LOCK TABLE shard_partitions IN ACCESS
EXCLUSIVE MODE`` waits for every batch that read the old states, and every batch that
reads after the move's commit sees the new ones (READ COMMITTED: a statement's snapshot
is taken after its locks are granted). A store without a fence (one database) never
reads the table.

**The seeding.** A shard's rows are written the first time its store is opened by
``connect_event_store`` (``seed_partitions``): if the shard's ``shard_partitions`` is
empty, the map in force (read from the control database at that moment, not the map the
engine started with) gives the shard partitions, and no move is recorded as under way
(``shard_map.moving`` is NULL), those partitions are inserted ``'active'`` at the map's
epoch. One statement, conditional on the table being empty, ``ON CONFLICT DO NOTHING``:
engines opening the shard together write the rows once, and a shard that holds rows
(a move changed them) is never seeded again. A shard the map gives no partition gets
none (a new shard waits for a move to give it some).

**What a move uses** (``saga shard move``): ``seed_partitions`` (a shard's table as an
engine's first open would write it, before a move changes it), ``mark_moving`` (step 2:
under the table lock, the range stops taking writes on the source), ``activate`` (step
5: the range takes writes on the target, at the new epoch), ``release`` (step 6: the
source no longer holds the range; an abort's on the target), ``resume`` (an abort on a
source), ``fence_states`` (what a shard's table says, for ``status`` and the checks).
Each runs in the caller's transaction and connection.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from saga_engine.kernel._errors import ShardMapError, StaleShardMap
from saga_engine.kernel._partitioning import partition_for
from saga_engine.store._pgbase import _Conn

__all__ = [
    "AnyConn",
    "PartitionState",
    "ShardFence",
    "activate",
    "fence_states",
    "mark_moving",
    "release",
    "seed_partitions",
]

PartitionState = Literal["active", "moving"]
#: A connection of a pool, or one of its own (a move's).
AnyConn: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"

#: The fence's read, once per batch (only with a fence).
READ_FENCE: Final = "SELECT partition, state FROM shard_partitions WHERE partition = ANY($1::int[])"

#: The first open's seed: only into an empty table, once however many engines run it.
SEED_PARTITIONS: Final = """
INSERT INTO shard_partitions (partition, state, epoch)
SELECT p, 'active', $2 FROM unnest($1::int[]) AS p
WHERE NOT EXISTS (SELECT 1 FROM shard_partitions)
ON CONFLICT (partition) DO NOTHING
"""


@dataclass(frozen=True, slots=True)
class ShardFence:
    """What a shard's store checks its writes against: ``partitions`` is the inbox's
    partition count (the shard map's), ``shard`` the shard's name (for the errors)."""

    partitions: int
    shard: str = ""

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ShardMapError(
                f"a fence needs the inbox's partition count (at least 1), not {self.partitions}"
            )

    async def refused(self, conn: _Conn, saga_ids: Iterable[str]) -> dict[str, StaleShardMap]:
        """The sagas among ``saga_ids`` this shard must not write now, each with its
        error: one statement, in ``conn``'s transaction."""
        of = {saga_id: partition_for(saga_id, self.partitions) for saga_id in saga_ids}
        rows = await conn.fetch(READ_FENCE, sorted(set(of.values())))
        states: dict[int, str] = {r["partition"]: r["state"] for r in rows}
        return {
            saga_id: StaleShardMap(
                saga_id, self.shard, partition, moving=states.get(partition) == "moving"
            )
            for saga_id, partition in of.items()
            if states.get(partition) != "active"
        }


async def seed_partitions(conn: AnyConn, partitions: Collection[int], epoch: int) -> int:
    """Writes ``partitions`` as ``'active'`` at ``epoch`` if the shard's table is empty
    (the module's rule: the caller checks that no move is under way and that
    ``partitions`` are the map in force's for this shard); how many rows it wrote."""
    if not partitions:
        return 0
    done = await conn.execute(SEED_PARTITIONS, sorted(partitions), epoch)
    return int(done.split()[-1])


async def fence_states(conn: AnyConn) -> dict[int, tuple[PartitionState, int]]:
    """The shard's table: partition -> (state, epoch)."""
    rows = await conn.fetch("SELECT partition, state, epoch FROM shard_partitions")
    return {r["partition"]: (r["state"], r["epoch"]) for r in rows}


async def mark_moving(conn: AnyConn, partitions: Collection[int]) -> int:
    """A move's step 2, on the source, in the caller's transaction: locks the table
    (waiting for every group commit that read it) and marks ``partitions`` 'moving';
    their writes are refused from the commit on. How many rows it changed (the
    partitions the shard holds; a second run changes none)."""
    await conn.execute("LOCK TABLE shard_partitions IN ACCESS EXCLUSIVE MODE")
    done = await conn.execute(
        "UPDATE shard_partitions SET state = 'moving', changed_at = now() "
        "WHERE partition = ANY($1::int[]) AND state = 'active'",
        sorted(partitions),
    )
    return int(done.split()[-1])


async def activate(conn: AnyConn, partitions: Collection[int], epoch: int) -> None:
    """A move's step 5 on the target (or ``--abort`` on the source: the range takes
    writes there again): ``partitions`` are 'active' at ``epoch``, whatever they were."""
    await conn.execute("LOCK TABLE shard_partitions IN ACCESS EXCLUSIVE MODE")
    await conn.execute(
        "INSERT INTO shard_partitions (partition, state, epoch) "
        "SELECT p, 'active', $2 FROM unnest($1::int[]) AS p "
        "ON CONFLICT (partition) DO UPDATE SET state = 'active', epoch = $2, "
        "changed_at = now()",
        sorted(partitions),
        epoch,
    )


async def release(conn: AnyConn, partitions: Collection[int]) -> int:
    """A move's step 6 on the source: the shard no longer holds ``partitions`` (a write
    routed to it by an old map is refused as stale); how many rows it removed."""
    await conn.execute("LOCK TABLE shard_partitions IN ACCESS EXCLUSIVE MODE")
    done = await conn.execute(
        "DELETE FROM shard_partitions WHERE partition = ANY($1::int[])", sorted(partitions)
    )
    return int(done.split()[-1])


async def resume(conn: AnyConn, partitions: Collection[int]) -> int:
    """A move's ``--abort`` on a source: the range it paused takes writes again, at the
    epoch it had; how many rows it changed."""
    await conn.execute("LOCK TABLE shard_partitions IN ACCESS EXCLUSIVE MODE")
    done = await conn.execute(
        "UPDATE shard_partitions SET state = 'active', changed_at = now() "
        "WHERE partition = ANY($1::int[]) AND state = 'moving'",
        sorted(partitions),
    )
    return int(done.split()[-1])
