"""Moving a range of inbox partitions from shard to shard, online (``saga shard move``;
docs/operations.md, "Past one database").

A move is a sequence of steps, each of which can be run again, driven by what the
control database records (``shard_map.moving``):

1. record the move in the map's current row (compare-and-set on the epoch, and on no
   other move under way);
2. on each source shard, under ``LOCK TABLE shard_partitions IN ACCESS EXCLUSIVE MODE``
   (which waits for every group commit that read the table), mark the range ``moving``:
   the fence refuses its sagas' writes from here, the other partitions' go on;
3. copy the range's rows of every per-saga table to the target in batches (binary COPY
   into a temporary table, then ``INSERT ... ON CONFLICT DO NOTHING``: a second run
   copies what is missing);
4. verify, per saga, the same ``last_seq`` and number of events on both sides, and the
   same number of rows of each table;
5. mark the range ``active`` on the target and advance the map's epoch: the commit point,
   before which the old map is in force;
6. remove the range from the sources' ``shard_partitions``, delete its rows there, and
   clear the move.

``--abort`` before (5) undoes (2)-(3); after (5) the move is done and running it again
finishes its cleanup. Crash points (``SAGA_CRASH_AT``) follow each step.

What stays where it is: the insights' aggregates (per shard, summed by a read). The
domain events' facts move with the range of their key (a fact lives in its key's
shard, as a saga id would). A blob moves with the references of the range's
sagas; the source's copy is left to its sweep once no reference holds it.
"""

from __future__ import annotations

import io
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeAlias

import asyncpg

from saga_engine.kernel._errors import ShardMapError
from saga_engine.kernel._partitioning import key_hash, partition_for
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.kernel._shards import ShardMap, format_partitions, parse_partitions
from saga_engine.store._pgbase import _unavailable_as_transient
from saga_engine.store._pgfence import activate, mark_moving, release, resume, seed_partitions
from saga_engine.store._pgshard_map import PostgresShardMapStore, StoredShardMap

__all__ = [
    "MOVE_CRASH_POINTS",
    "MovePlan",
    "MoveReport",
    "ShardMover",
    "plan_move",
    "resumable",
]

#: The crash points of a move, in the order it passes them (``SAGA_CRASH_AT``).
MOVE_CRASH_POINTS = (
    "move_after_record",
    "move_after_pause",
    "move_after_copy_batch",
    "move_after_copy",
    "move_after_verify",
    "move_after_target_active",
    "move_after_commit",
    "move_after_release",
    "move_after_delete",
)

#: Sagas per batch of the copy (their histories, blob references with them).
DEFAULT_BATCH = 2000
#: How long one attempt to lock a source's ``shard_partitions`` waits, and how many.
LOCK_TIMEOUT_MS = 2000
LOCK_ATTEMPTS = 15

#: The tables of a saga's rows, by ``saga_id``: its row first (a copy of a batch writes
#: the saga row with its history in one transaction).
_BY_SAGA = ("sagas", "saga_decisions", "saga_blob_refs")
_COUNTED = (*_BY_SAGA, "saga_archive", "saga_key_slots", "saga_domain_events")


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True, slots=True)
class MovePlan:
    """A move as the control database records it: the partitions that move, from which
    shard each (a range may span several), to which shard, the map's epoch it started
    from, and when each step was reached (ISO times; None before)."""

    partitions: frozenset[int]
    to: str
    sources: Mapping[str, frozenset[int]]
    epoch: int
    started_at: str
    paused_at: str | None = None
    committed_at: str | None = None

    @property
    def text(self) -> str:
        return format_partitions(self.partitions)

    def to_data(self) -> dict[str, Any]:
        return {
            "partitions": self.text,
            "to": self.to,
            "from": {name: format_partitions(ps) for name, ps in sorted(self.sources.items())},
            "epoch": self.epoch,
            "started_at": self.started_at,
            "paused_at": self.paused_at,
            "committed_at": self.committed_at,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any], partitions: int) -> MovePlan:
        """The move ``to_data`` recorded (``partitions``: the inbox's count)."""
        try:
            return cls(
                partitions=parse_partitions(str(data["partitions"]), partitions),
                to=str(data["to"]),
                sources={
                    str(name): parse_partitions(str(text), partitions)
                    for name, text in dict(data["from"]).items()
                },
                epoch=int(data["epoch"]),
                started_at=str(data["started_at"]),
                paused_at=data.get("paused_at"),
                committed_at=data.get("committed_at"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardMapError(f"the recorded move is not readable: {exc!r}") from exc

    def target_map(self, before: ShardMap) -> ShardMap:
        """The map after this move (the next epoch of ``before``)."""
        return before.moved(self.partitions, self.to)

    def committed(self, in_force: ShardMap) -> bool:
        """Whether the map in force is past this move's commit point."""
        return in_force.epoch > self.epoch

    def describe(self) -> str:
        sources = ", ".join(f"{format_partitions(ps)} from {n!r}" for n, ps in self.sources.items())
        return f"partitions {self.text} to shard {self.to!r} ({sources}; epoch {self.epoch})"


def plan_move(in_force: ShardMap, partitions: frozenset[int], to: str) -> MovePlan:
    """The move of ``partitions`` to shard ``to`` under the map in force; a
    ``ShardMapError`` for an unknown shard, a partition that does not exist, or a range
    already there (the map's own checks). Partitions of the range already on ``to``
    stay where they are."""
    in_force.moved(partitions, to)  # the checks
    moving = frozenset(p for p in partitions if in_force.owners[p] != to)
    sources = {name: frozenset(ps) for name, ps in sorted(in_force.by_shard(moving).items()) if ps}
    return MovePlan(moving, to, sources, in_force.epoch, _now())


def resumable(
    plan: MovePlan, in_force: ShardMap, partitions: frozenset[int] | None, to: str | None
) -> None:
    """Refuses a request that is not the move under way (``None``: not asked). The range
    may be asked as it was, with the partitions it left out for being on the target
    already."""
    extra = set() if partitions is None else partitions - plan.partitions
    same = (
        (to is None or to == plan.to)
        and (partitions is None or plan.partitions <= partitions)
        and all(in_force.owners[p] == plan.to for p in extra)
    )
    if not same:
        raise ShardMapError(
            f"another move is under way: {plan.describe()}. Run `saga shard move "
            f"--partitions {plan.text} --to {plan.to}` to finish it, or `saga shard move "
            "--abort` to undo it, before starting another"
        )


@dataclass(slots=True)
class MoveReport:
    """What a run of ``saga shard move`` did."""

    partitions: str
    to: str
    sources: dict[str, str]
    outcome: str  # "moved", "aborted"
    epoch: int
    sagas: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    paused_s: float | None = None
    resumed: bool = False

    def to_data(self) -> dict[str, Any]:
        return {
            "partitions": self.partitions,
            "to": self.to,
            "from": self.sources,
            "outcome": self.outcome,
            "epoch": self.epoch,
            "sagas": self.sagas,
            "rows": self.rows,
            "seconds": round(self.seconds, 3),
            "paused_s": None if self.paused_s is None else round(self.paused_s, 3),
            "resumed": self.resumed,
        }


Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record]"
Progress: TypeAlias = Callable[[str], None]
CrashHook: TypeAlias = Callable[[str], None]


def _no_crash(point: str) -> None:
    return None


def _quiet(line: str) -> None:
    return None


def _seconds_between(start: str | None, end: str | None) -> float | None:
    if start is None or end is None:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


@dataclass(frozen=True, slots=True)
class _Selection:
    """The rows of a range on one shard: its sagas by id (sorted), its archived sagas'
    ids, the concurrency keys whose slots live in the range, and the keys of the
    domain events' facts that do (a fact lives in its key's shard)."""

    saga_ids: list[str]
    archived_ids: list[str]
    keys: list[str]
    fact_keys: list[str]


class ShardMover:
    """Runs (or resumes, or aborts) the move of a range, over the control database's
    map and one connection per shard involved. Build with ``ShardMover.opened``."""

    def __init__(
        self,
        maps: PostgresShardMapStore,
        connect: Callable[[str], Any],
        *,
        batch: int = DEFAULT_BATCH,
        crash: CrashHook | None = None,
        progress: Progress | None = None,
    ) -> None:
        self._maps = maps
        self._connect = connect
        self._conns: dict[str, Conn] = {}
        self._batch = max(1, batch)
        self._crash = crash or _no_crash
        self._progress = progress or _quiet

    @classmethod
    @asynccontextmanager
    async def opened(
        cls,
        pg: PostgresSettings,
        *,
        batch: int = DEFAULT_BATCH,
        crash: CrashHook | None = None,
        progress: Progress | None = None,
    ) -> AsyncIterator[ShardMover]:
        """A mover over the control database and shards of ``pg`` (connections closed
        after)."""
        if not pg.shards:
            raise ShardMapError("no shards are configured (SAGA_PG__SHARDS): nothing to move")
        control = pg.control()
        async with AsyncExitStack() as stack:

            async def connect(name: str) -> Conn:
                with _unavailable_as_transient():
                    conn: Conn = await asyncpg.connect(
                        pg.shard_dsn(name),
                        timeout=10.0,
                        server_settings={"search_path": pg.db_schema},
                    )
                stack.push_async_callback(conn.close)
                return conn

            maps = await stack.enter_async_context(
                PostgresShardMapStore.opened(
                    control.dsn.get_secret_value(), control.db_schema, timeout_s=60.0
                )
            )
            yield cls(maps, connect, batch=batch, crash=crash, progress=progress)

    async def _shard(self, name: str) -> Conn:
        if name not in self._conns:
            self._conns[name] = await self._connect(name)
        return self._conns[name]

    async def _current(self) -> StoredShardMap:
        stored = await self._maps.current()
        if stored is None:
            raise ShardMapError(
                "the shard map is not seeded yet: start an engine once (it writes the "
                "settings' map), then move"
            )
        return stored

    # ------------------------------------------------------------------ the front door

    async def move(self, partitions: str, to: str) -> MoveReport:
        """Moves ``partitions`` (text, ``"48-63"``) to shard ``to``, or resumes the same
        move left unfinished."""
        started = time.monotonic()
        stored = await self._current()
        wanted = parse_partitions(partitions, stored.map.partitions)
        resumed = stored.moving is not None
        if stored.moving is not None:
            plan = MovePlan.from_data(stored.moving, stored.map.partitions)
            resumable(plan, stored.map, wanted, to)
            self._progress(f"resuming the move of {plan.describe()}")
            await self._open_all(plan)
        else:
            plan = plan_move(stored.map, wanted, to)
            await self._open_all(plan)  # every shard answers before anything is written
            if not await self._maps.set_moving(plan.epoch, plan.to_data(), expected=None):
                raise ShardMapError(
                    "the shard map changed while the move was being recorded (another move "
                    "or writer): nothing was done; read it again (`saga shard status`)"
                )
            self._progress(f"recorded the move of {plan.describe()}")
            self._crash("move_after_record")
        report = MoveReport(
            plan.text, plan.to, _texts(plan.sources), "moved", plan.epoch, resumed=resumed
        )
        if not plan.committed(stored.map):
            plan = await self._up_to_commit(plan, stored.map, report)
        await self._cleanup(plan, report)
        report.seconds = time.monotonic() - started
        report.paused_s = _seconds_between(plan.paused_at, plan.committed_at)
        report.epoch = plan.epoch + 1
        return report

    async def abort(self, partitions: str | None = None, to: str | None = None) -> MoveReport:
        """Undoes the move under way before its commit point: the range ``active`` on its
        sources again, its copied rows and partitions gone from the target, the move
        cleared. Refused after the commit point (run the move again to finish it)."""
        started = time.monotonic()
        stored = await self._current()
        if stored.moving is None:
            raise ShardMapError("no move is under way: nothing to abort")
        plan = MovePlan.from_data(stored.moving, stored.map.partitions)
        wanted = None if partitions is None else parse_partitions(partitions, stored.map.partitions)
        resumable(plan, stored.map, wanted, to)
        if plan.committed(stored.map):
            raise ShardMapError(
                f"the move of {plan.describe()} is past its commit point (the map is at epoch "
                f"{stored.map.epoch}): it cannot be aborted. Run `saga shard move --partitions "
                f"{plan.text} --to {plan.to}` to finish its cleanup (a move back is a new move)"
            )
        await self._open_all(plan)
        target = await self._shard(plan.to)
        await self._locked(target, partial(release, target, plan.partitions))
        removed = await self._delete_range(target, plan.partitions, stored.map.partitions)
        for name, ps in plan.sources.items():
            conn = await self._shard(name)
            await self._locked(conn, partial(resume, conn, ps))
        if not await self._maps.set_moving(plan.epoch, None, expected=stored.moving):
            raise ShardMapError("the shard map changed while the move was aborted; run again")
        self._progress(f"aborted the move of {plan.describe()}")
        report = MoveReport(plan.text, plan.to, _texts(plan.sources), "aborted", plan.epoch)
        report.rows = {f"deleted from {plan.to}: {t}": n for t, n in removed.items()}
        report.seconds = time.monotonic() - started
        return report

    async def _open_all(self, plan: MovePlan) -> None:
        for name in (*plan.sources, plan.to):
            await self._shard(name)

    # ------------------------------------------------------------------ steps 2 to 5

    async def _up_to_commit(self, plan: MovePlan, before: ShardMap, report: MoveReport) -> MovePlan:
        for name, ps in plan.sources.items():  # (2)
            conn = await self._shard(name)
            await self._locked(conn, partial(_pause, conn, before.partitions_of(name), ps, before))
        if plan.paused_at is None:
            paused = replace(plan, paused_at=_now())
            if not await self._maps.set_moving(
                plan.epoch, paused.to_data(), expected=plan.to_data()
            ):
                raise ShardMapError("the recorded move changed while it ran; run it again")
            plan = paused
        self._progress(f"paused partitions {plan.text} on {', '.join(plan.sources)}")
        self._crash("move_after_pause")
        target = await self._shard(plan.to)
        for name, ps in plan.sources.items():  # (3) and (4)
            source = await self._shard(name)
            selection = await _select(source, ps, before.partitions, backfill=True)
            report.sagas += len(selection.saga_ids)
            await self._copy(source, target, selection, report.rows)
            self._crash("move_after_copy")
            if await _select(source, ps, before.partitions, backfill=False) != selection:
                raise ShardMapError(
                    f"the rows of partitions {format_partitions(ps)} on {name!r} changed during "
                    "the copy (a concurrency key's slot or a domain event's fact of a new key: "
                    "writes the fence does not stop). The old map stays in force with the "
                    "range paused: run the move again"
                )
            await self._verify(name, source, plan.to, target, selection)
            copied = await _select(target, ps, before.partitions, backfill=False)
            if copied != selection:
                raise ShardMapError(
                    f"shard {plan.to!r} holds other rows of partitions {format_partitions(ps)} "
                    f"than {name!r} after the copy ({len(copied.saga_ids)} sagas against "
                    f"{len(selection.saga_ids)}): rows left there by something else than "
                    "this move. The old map stays in force with the range paused; "
                    "`saga shard move --abort` removes them"
                )
        self._progress(f"verified {report.sagas} sagas on {plan.to!r}")
        self._crash("move_after_verify")
        after = plan.target_map(before)
        await self._locked(target, partial(_activate, target, plan, before, after))
        self._crash("move_after_target_active")
        committed = replace(plan, committed_at=_now())
        await self._maps.advance(plan.epoch, after, moving=committed.to_data())  # (5)
        self._progress(f"committed: the shard map is at epoch {after.epoch}")
        self._crash("move_after_commit")
        return committed

    async def _locked(self, conn: Conn, work: Callable[[], Any]) -> Any:
        """``work`` in a transaction holding ``shard_partitions`` exclusively (each
        attempt waits at most ``LOCK_TIMEOUT_MS`` for the group commits that read it)."""
        for attempt in range(1, LOCK_ATTEMPTS + 1):
            try:
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'")
                    await conn.execute("LOCK TABLE shard_partitions IN ACCESS EXCLUSIVE MODE")
                    return await work()
            except asyncpg.LockNotAvailableError:
                self._progress(f"shard_partitions is busy (attempt {attempt}); trying again")
        raise ShardMapError(
            f"could not lock shard_partitions in {LOCK_ATTEMPTS} attempts of "
            f"{LOCK_TIMEOUT_MS} ms (a long transaction holds it): run the move again"
        )

    async def _copy(
        self, source: Conn, target: Conn, selection: _Selection, rows: dict[str, int]
    ) -> None:
        ids = selection.saga_ids
        for start in range(0, len(ids), self._batch):
            chunk = ids[start : start + self._batch]
            async with target.transaction():
                for table in _BY_SAGA:
                    rows[table] = rows.get(table, 0) + await _copy_rows(
                        source, target, table, "saga_id = ANY($1::text[])", chunk
                    )
                rows["saga_blobs"] = rows.get("saga_blobs", 0) + await _copy_rows(
                    source,
                    target,
                    "saga_blobs",
                    "digest IN (SELECT digest FROM saga_blob_refs WHERE saga_id = ANY($1::text[]))",
                    chunk,
                )
            self._progress(
                f"copied {min(start + self._batch, len(ids))}/{len(ids)} sagas "
                f"({rows.get('saga_decisions', 0)} decision rows)"
            )
            self._crash("move_after_copy_batch")
        archived = selection.archived_ids
        for start in range(0, len(archived), self._batch):
            chunk = archived[start : start + self._batch]
            rows["saga_archive"] = rows.get("saga_archive", 0) + await _copy_rows(
                source, target, "saga_archive", "saga_id = ANY($1::text[])", chunk
            )
        if selection.keys:
            async with target.transaction():
                rows["saga_key_slots"] = await _copy_rows(
                    source, target, "saga_key_slots", "key = ANY($1::text[])", selection.keys
                )
                await target.execute(
                    "SELECT setval(pg_get_serial_sequence('saga_key_slots', 'position'), "
                    "(SELECT max(position) FROM saga_key_slots))"
                )
        facts = selection.fact_keys
        for start in range(0, len(facts), self._batch):
            rows["saga_domain_events"] = rows.get("saga_domain_events", 0) + await _copy_rows(
                source,
                target,
                "saga_domain_events",
                "key = ANY($1::text[])",
                facts[start : start + self._batch],
            )

    async def _verify(
        self, name: str, source: Conn, to: str, target: Conn, selection: _Selection
    ) -> None:
        ids = selection.saga_ids
        for start in range(0, len(ids), self._batch * 4):
            chunk = ids[start : start + self._batch * 4]
            there, here = await _histories(source, chunk), await _histories(target, chunk)
            for saga_id in chunk:
                if there.get(saga_id) != here.get(saga_id):
                    raise ShardMapError(
                        f"saga {saga_id!r} differs after the copy: (last_seq, events) is "
                        f"{there.get(saga_id)} on {name!r} and {here.get(saga_id)} on {to!r}. "
                        "The old map stays in force with the range paused: run the move "
                        "again, or `saga shard move --abort`"
                    )
        counts_there, counts_here = (
            await _counts(source, selection),
            await _counts(target, selection),
        )
        if counts_there != counts_here:
            raise ShardMapError(
                f"the range's rows differ after the copy: {counts_there} on {name!r}, "
                f"{counts_here} on {to!r}. The old map stays in force with the range "
                "paused: run the move again, or `saga shard move --abort`"
            )

    # ------------------------------------------------------------------ step 6

    async def _cleanup(self, plan: MovePlan, report: MoveReport) -> None:
        stored = await self._current()
        for name in plan.sources:
            conn = await self._shard(name)
            await self._locked(conn, partial(release, conn, plan.partitions))
        self._progress(f"released partitions {plan.text} on {', '.join(plan.sources)}")
        self._crash("move_after_release")
        for name, ps in plan.sources.items():
            deleted = await self._delete_range(await self._shard(name), ps, stored.map.partitions)
            for table, n in deleted.items():
                report.rows[f"deleted from {name}: {table}"] = n
        self._crash("move_after_delete")
        if not await self._maps.set_moving(stored.map.epoch, None, expected=stored.moving):
            raise ShardMapError("the recorded move changed during its cleanup; run it again")
        self._progress(f"done: partitions {plan.text} are on {plan.to!r}")

    async def _delete_range(
        self, conn: Conn, ps: frozenset[int], partitions: int
    ) -> dict[str, int]:
        selection = await _select(conn, ps, partitions, backfill=False)
        deleted: dict[str, int] = {}
        ids = selection.saga_ids
        for start in range(0, len(ids), self._batch):
            chunk = ids[start : start + self._batch]
            async with conn.transaction():
                for table in reversed(_BY_SAGA):
                    deleted[table] = deleted.get(table, 0) + _affected(
                        await conn.execute(
                            f"DELETE FROM {table} WHERE saga_id = ANY($1::text[])", chunk
                        )
                    )
        if selection.archived_ids:
            deleted["saga_archive"] = _affected(
                await conn.execute(
                    "DELETE FROM saga_archive WHERE saga_id = ANY($1::text[])",
                    selection.archived_ids,
                )
            )
        if selection.keys:
            deleted["saga_key_slots"] = _affected(
                await conn.execute(
                    "DELETE FROM saga_key_slots WHERE key = ANY($1::text[])", selection.keys
                )
            )
        if selection.fact_keys:
            deleted["saga_domain_events"] = _affected(
                await conn.execute(
                    "DELETE FROM saga_domain_events WHERE key = ANY($1::text[])",
                    selection.fact_keys,
                )
            )
        self._progress(f"deleted {len(ids)} sagas' rows of partitions {format_partitions(ps)}")
        return deleted


# ---------------------------------------------------------------------- statements


def _texts(sources: Mapping[str, frozenset[int]]) -> dict[str, str]:
    return {name: format_partitions(ps) for name, ps in sources.items()}


def _affected(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])


async def _select(conn: Conn, ps: frozenset[int], partitions: int, *, backfill: bool) -> _Selection:
    """The range's rows on a shard. A saga written before its ``key_hash`` was kept gets
    it first (``backfill``), so that the range is a query."""
    if backfill:
        unhashed = [
            r["saga_id"]
            for r in await conn.fetch("SELECT saga_id FROM sagas WHERE key_hash IS NULL")
        ]
        if unhashed:
            await conn.execute(
                "UPDATE sagas SET key_hash = u.h FROM unnest($1::text[], $2::int[]) AS u(id, h) "
                "WHERE saga_id = u.id AND key_hash IS NULL",
                unhashed,
                [key_hash(i) for i in unhashed],
            )
    rows = await conn.fetch(
        "SELECT saga_id FROM sagas WHERE key_hash % $1 = ANY($2::int[]) ORDER BY saga_id",
        partitions,
        sorted(ps),
    )
    archived = await conn.fetch("SELECT DISTINCT saga_id FROM saga_archive ORDER BY saga_id")
    keys = await conn.fetch("SELECT DISTINCT key FROM saga_key_slots ORDER BY key")
    facts = await conn.fetch("SELECT DISTINCT key FROM saga_domain_events ORDER BY key")
    return _Selection(
        [r["saga_id"] for r in rows],
        [r["saga_id"] for r in archived if partition_for(r["saga_id"], partitions) in ps],
        [r["key"] for r in keys if partition_for(r["key"], partitions) in ps],
        [r["key"] for r in facts if partition_for(r["key"], partitions) in ps],
    )


async def _copy_rows(source: Conn, target: Conn, table: str, where: str, arg: Sequence[str]) -> int:
    """Copies ``table``'s rows matching ``where`` (``$1``: ``arg``) from ``source`` to
    ``target``, keeping those already there; the number of rows inserted."""
    buffer = io.BytesIO()
    await source.copy_from_query(
        f"SELECT * FROM {table} WHERE {where}", list(arg), output=buffer, format="binary"
    )
    buffer.seek(0)
    staging = f"move_{table}"
    await target.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {staging} (LIKE {table}); TRUNCATE {staging}"
    )
    await target.copy_to_table(staging, source=buffer, format="binary")
    status = await target.execute(
        f"INSERT INTO {table} SELECT * FROM {staging} ON CONFLICT DO NOTHING"
    )
    return _affected(status)


async def _histories(conn: Conn, ids: list[str]) -> dict[str, tuple[int, int]]:
    rows = await conn.fetch(
        "SELECT s.saga_id, s.last_seq, coalesce((SELECT sum(cardinality(d.kinds)) "
        "FROM saga_decisions d WHERE d.saga_id = s.saga_id), 0) AS events "
        "FROM sagas s WHERE s.saga_id = ANY($1::text[])",
        ids,
    )
    return {r["saga_id"]: (r["last_seq"], int(r["events"])) for r in rows}


async def _counts(conn: Conn, selection: _Selection) -> dict[str, int]:
    ids, archived, keys = selection.saga_ids, selection.archived_ids, selection.keys
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM sagas WHERE saga_id = ANY($1::text[])) AS sagas, "
        "(SELECT count(*) FROM saga_decisions WHERE saga_id = ANY($1::text[])) "
        "AS saga_decisions, "
        "(SELECT count(*) FROM saga_blob_refs WHERE saga_id = ANY($1::text[])) "
        "AS saga_blob_refs, "
        "(SELECT count(*) FROM saga_archive WHERE saga_id = ANY($2::text[])) AS saga_archive, "
        "(SELECT count(*) FROM saga_key_slots WHERE key = ANY($3::text[])) AS saga_key_slots, "
        "(SELECT count(*) FROM saga_domain_events WHERE key = ANY($4::text[])) "
        "AS saga_domain_events",
        ids,
        archived,
        keys,
        selection.fact_keys,
    )
    assert row is not None
    return {table: int(row[table]) for table in _COUNTED}


async def _pause(conn: Conn, holds: frozenset[int], ps: frozenset[int], in_force: ShardMap) -> None:
    """Step (2) on a source: its table seeded as an engine's first open would (when still
    empty), then the range ``moving`` (the fence's rule, ``_pgfence``)."""
    await seed_partitions(conn, holds, in_force.epoch)
    await mark_moving(conn, ps)


async def _activate(target: Conn, plan: MovePlan, before: ShardMap, after: ShardMap) -> None:
    """Step (5) on the target: its table seeded as an engine's first open would (when
    still empty), then the range ``active`` at the new epoch."""
    await seed_partitions(target, before.partitions_of(plan.to), before.epoch)
    await activate(target, plan.partitions, after.epoch)
