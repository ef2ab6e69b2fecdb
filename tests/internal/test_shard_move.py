"""Moving a range of inbox partitions between shards (store/_pgshard_move.py; issue 43):
the plan, and the move on real Postgres clusters: shard ``a`` on the second cluster,
``b`` on the third, ``c`` in the control database's schema on the first (a shard may
share a database with the control tables: they are different tables)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from saga_engine import SagaStatus, Settings
from saga_engine.events import SagaCompleted, SagaStarted, SideEffectRecorded
from saga_engine.kernel._errors import ShardMapError
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._shards import ShardMap
from saga_engine.settings import KafkaSettings, PostgresSettings
from saga_engine.store import Append, NewSaga, Projection
from saga_engine.store._connect import connect_event_store
from saga_engine.store._databases import migrate_all
from saga_engine.store._pgshard_move import (
    MOVE_CRASH_POINTS,
    MovePlan,
    ShardMover,
    plan_move,
    resumable,
)
from saga_engine.store._store import EventStore
from tests.conftest import PgTarget

PARTITIONS = 8


# ---------------------------------------------------------------------- the plan (no I/O)


def _map() -> ShardMap:
    return ShardMap.build({"a": "0-3", "b": "4-5", "c": "6-7"}, PARTITIONS, epoch=3)


def test_a_plan_names_each_source_and_leaves_out_what_is_there() -> None:
    plan = plan_move(_map(), frozenset(range(2, 8)), "c")
    assert plan.partitions == frozenset(range(2, 6))
    assert dict(plan.sources) == {"a": frozenset({2, 3}), "b": frozenset({4, 5})}
    assert (plan.to, plan.epoch, plan.paused_at, plan.committed_at) == ("c", 3, None, None)
    assert plan.target_map(_map()).ranges() == {"a": "0-1", "b": "", "c": "2-7"}
    assert plan.target_map(_map()).epoch == 4


def test_a_plan_reads_back_as_recorded() -> None:
    plan = plan_move(_map(), frozenset({0, 1, 4}), "c")
    data = plan.to_data()
    assert data["partitions"] == "0-1,4"
    assert data["from"] == {"a": "0-1", "b": "4"}
    assert MovePlan.from_data(data, PARTITIONS) == plan
    assert not plan.committed(_map())
    assert plan.committed(plan.target_map(_map()))


@pytest.mark.parametrize(
    ("partitions", "to", "says"),
    [
        (frozenset({1}), "z", "no shard is named 'z'"),
        (frozenset({8, 9}), "c", "partitions 8-9 do not exist"),
        (frozenset({6, 7}), "c", "already on shard 'c'"),
    ],
)
def test_a_bad_request_is_refused(partitions: frozenset[int], to: str, says: str) -> None:
    with pytest.raises(ShardMapError, match=says):
        plan_move(_map(), partitions, to)


def test_only_the_move_under_way_resumes() -> None:
    plan = plan_move(_map(), frozenset(range(2, 8)), "c")  # 6-7 are on c already
    resumable(plan, _map(), frozenset(range(2, 8)), "c")
    resumable(plan, _map(), frozenset(range(2, 6)), "c")
    resumable(plan, _map(), None, None)
    for partitions, to in [(frozenset(range(0, 8)), "c"), (frozenset({2, 3}), "c"), (None, "b")]:
        with pytest.raises(ShardMapError, match="another move is under way"):
            resumable(plan, _map(), partitions, to)


def test_an_unreadable_recorded_move_is_an_error() -> None:
    with pytest.raises(ShardMapError, match="recorded move is not readable"):
        MovePlan.from_data({"partitions": "0-1"}, PARTITIONS)


# ---------------------------------------------------------------------- on real clusters


def settings_of(pg: PgTarget, shards: Sequence[PgTarget]) -> Settings:
    a, b = shards
    return Settings(
        pg=PostgresSettings.model_validate(
            {
                "dsn": pg.database_dsn,
                "db_schema": pg.schema,
                "control_dsn": pg.database_dsn,
                "shards": [
                    {"name": "a", "partitions": "0-7", "dsn": a.database_dsn},
                    {"name": "b", "partitions": "", "dsn": b.database_dsn},
                    {"name": "c", "partitions": "", "dsn": pg.database_dsn},
                ],
            }
        ),
        kafka=KafkaSettings(partitions=PARTITIONS),
    )


async def write_sagas(settings: Settings, count: int) -> list[str]:
    """``count`` sagas through the sharded store, each with a history of a few
    decisions (a third of them completed)."""
    for report in await migrate_all(settings):
        assert report.ok, report
    store = await connect_event_store(settings)
    ids = [f"order-{i}" for i in range(count)]
    try:
        at = datetime.now(UTC)
        for i, saga_id in enumerate(ids):
            started = SagaStarted(at=at, saga_type="order", input={"n": i})
            await store.create(NewSaga(saga_id, "order", [started], Projection(SagaStatus.RUNNING)))
            effects = [
                SideEffectRecorded(at=at, op_id=f"op-{k}", value=k) for k in range(i % 3 + 1)
            ]
            seq = await store.append(Append(saga_id, 1, effects, Projection(SagaStatus.RUNNING)))
            if i % 3 == 0:
                done = SagaCompleted(at=at, output={"n": i})
                await store.append(Append(saga_id, seq, [done], Projection(SagaStatus.COMPLETED)))
    finally:
        await store.close()
    return ids


async def histories(store: EventStore, ids: Sequence[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for saga_id in ids:
        loaded = await store.load(saga_id)
        out[saga_id] = (loaded.record.status, loaded.record.last_seq, loaded.events)
    return out


async def rows(target: PgTarget, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(
        target.database_dsn, server_settings={"search_path": target.schema}
    )
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


async def in_shard(target: PgTarget) -> set[str]:
    return {r["saga_id"] for r in await rows(target, "SELECT saga_id FROM sagas")}


async def fence(target: PgTarget) -> dict[int, str]:
    found = await rows(target, "SELECT partition, state FROM shard_partitions")
    return {r["partition"]: r["state"] for r in found}


async def moving(pg: PgTarget) -> tuple[int, object]:
    [row] = await rows(pg, "SELECT epoch, moving FROM shard_map ORDER BY epoch DESC LIMIT 1")
    return row["epoch"], row["moving"]


def of_range(ids: Sequence[str], low: int, high: int) -> set[str]:
    return {i for i in ids if low <= partition_for(i, PARTITIONS) <= high}


class Stop(Exception):
    """A crash, in process: the move stops where the hook raises."""


def stop_at(point: str) -> Callable[[str], None]:
    def hook(reached: str) -> None:
        if reached == point:
            raise Stop(point)

    return hook


@pytest.mark.integration
async def test_a_range_moves_and_reads_the_same_from_its_new_shard_only(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    settings = settings_of(pg, pg_shards)
    ids = await write_sagas(settings, 60)
    before_store = await connect_event_store(settings)
    try:
        before = await histories(before_store, ids)
    finally:
        await before_store.close()
    lines: list[str] = []
    async with ShardMover.opened(settings.pg, batch=7, progress=lines.append) as mover:
        report = await mover.move("4-7", "b")
    moved = of_range(ids, 4, 7)
    assert moved
    assert report.sagas == len(moved)
    assert report.rows["sagas"] == len(moved)
    assert report.paused_s is not None
    assert (report.outcome, report.epoch, report.resumed) == ("moved", 2, False)
    assert any(line.startswith("copied 7/") for line in lines)

    a, b = pg_shards
    assert await in_shard(b) == moved
    assert await in_shard(a) == set(ids) - moved
    decided = await rows(a, "SELECT DISTINCT saga_id FROM saga_decisions")
    assert {r["saga_id"] for r in decided} == set(ids) - moved
    assert await fence(a) == dict.fromkeys(range(4), "active")
    assert await fence(b) == dict.fromkeys(range(4, 8), "active")
    assert await moving(pg) == (2, None)

    after_store = await connect_event_store(settings)
    try:
        assert await histories(after_store, ids) == before
        listed = await after_store.list_sagas(limit=1000)
        assert sorted(r.saga_id for r in listed) == sorted(ids)
        counts = await after_store.count_by_status(cap=10_000)
        assert sum(counts.values()) == len(ids)
    finally:
        await after_store.close()


@pytest.mark.integration
async def test_abort_before_the_commit_point_puts_the_range_back(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    settings = settings_of(pg, pg_shards)
    ids = await write_sagas(settings, 30)
    a, b = pg_shards
    async with ShardMover.opened(settings.pg, crash=stop_at("move_after_target_active")) as mover:
        with pytest.raises(Stop):
            await mover.move("0-3", "b")
    assert (await fence(a))[0] == "moving"
    assert await in_shard(b) == of_range(ids, 0, 3)
    epoch, recorded = await moving(pg)
    assert epoch == 1
    assert recorded is not None

    async with ShardMover.opened(settings.pg) as mover:
        report = await mover.abort()
    assert report.outcome == "aborted"
    assert await fence(a) == dict.fromkeys(range(8), "active")
    assert await fence(b) == {}
    assert await in_shard(b) == set()
    assert await in_shard(a) == set(ids)
    assert await moving(pg) == (1, None)


@pytest.mark.integration
@pytest.mark.parametrize("point", MOVE_CRASH_POINTS)
async def test_a_move_stopped_at_any_step_finishes_when_run_again(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], point: str
) -> None:
    settings = settings_of(pg, pg_shards)
    ids = await write_sagas(settings, 20)
    async with ShardMover.opened(settings.pg, batch=3, crash=stop_at(point)) as mover:
        with pytest.raises(Stop):
            await mover.move("2-5", "c")
    async with ShardMover.opened(settings.pg, batch=3) as mover:
        report = await mover.move("2-5", "c")
    assert report.resumed
    a, _ = pg_shards
    assert await in_shard(pg) == of_range(ids, 2, 5)
    assert await in_shard(a) == set(ids) - of_range(ids, 2, 5)
    decisions = await rows(pg, "SELECT saga_id, seq FROM saga_decisions")
    assert len(decisions) == len({(r["saga_id"], r["seq"]) for r in decisions})
    assert await moving(pg) == (2, None)
    aborted_late = point in ("move_after_commit", "move_after_release", "move_after_delete")
    if aborted_late:  # a move past its commit point cannot be aborted (and is done now)
        async with ShardMover.opened(settings.pg) as mover:
            with pytest.raises(ShardMapError, match="no move is under way"):
                await mover.abort()


@pytest.mark.integration
async def test_abort_is_refused_after_the_commit_point(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    settings = settings_of(pg, pg_shards)
    await write_sagas(settings, 10)
    async with ShardMover.opened(settings.pg, crash=stop_at("move_after_commit")) as mover:
        with pytest.raises(Stop):
            await mover.move("0-3", "b")
    async with ShardMover.opened(settings.pg) as mover:
        with pytest.raises(ShardMapError, match="past its commit point"):
            await mover.abort()
        with pytest.raises(ShardMapError, match="another move is under way"):
            await mover.move("6-7", "c")
        report = await mover.move("0-3", "b")
    assert report.resumed
    assert await moving(pg) == (2, None)


async def _extras(target: PgTarget, saga_ids: Sequence[str]) -> None:
    """A blob referenced by each saga, an archived copy of each, a concurrency key's
    slot and a domain event's fact for each (their keys named as the saga, so they fall
    in the saga's partition)."""
    conn = await asyncpg.connect(
        target.database_dsn, server_settings={"search_path": target.schema}
    )
    try:
        for n, saga_id in enumerate(saga_ids):
            digest = f"d-{saga_id}"
            await conn.execute(
                "INSERT INTO saga_blobs (digest, data, size) VALUES ($1, $2, 3)", digest, b"abc"
            )
            await conn.execute("INSERT INTO saga_blob_refs VALUES ($1, $2)", saga_id, digest)
            await conn.execute(
                "INSERT INTO saga_archive (saga_id, saga_type, status, created_at, finished_at, "
                "history) VALUES ($1, 'order', 'completed', now(), now(), $2)",
                saga_id,
                saga_id.encode(),
            )
            await conn.execute(
                "INSERT INTO saga_key_slots (saga_id, saga_type, key, lim, held, queued_at) "
                "VALUES ($1, 'order', $1, 1, $2, now())",
                saga_id,
                n % 2 == 0,
            )
            await conn.execute(
                "INSERT INTO saga_domain_events (source, event_id, key, payload, received_at, "
                "expires_at) VALUES ('payments', $1, $1, '{}', now(), now() + interval '1 day')",
                saga_id,
            )
    finally:
        await conn.close()


async def _extra_rows(target: PgTarget) -> dict[str, set[str]]:
    return {
        "blobs": {r["digest"] for r in await rows(target, "SELECT digest FROM saga_blobs")},
        "refs": {r["saga_id"] for r in await rows(target, "SELECT saga_id FROM saga_blob_refs")},
        "archive": {r["saga_id"] for r in await rows(target, "SELECT saga_id FROM saga_archive")},
        "slots": {r["key"] for r in await rows(target, "SELECT key FROM saga_key_slots")},
        "facts": {r["key"] for r in await rows(target, "SELECT key FROM saga_domain_events")},
    }


@pytest.mark.integration
async def test_blobs_archives_key_slots_and_facts_move_with_their_range_from_two_sources(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    settings = settings_of(pg, pg_shards)
    ids = await write_sagas(settings, 40)
    a, b = pg_shards
    await _extras(a, ids)
    async with ShardMover.opened(settings.pg) as mover:
        first = await mover.move("4-7", "b")
    tables = ("saga_archive", "saga_key_slots", "saga_domain_events")
    assert [first.rows[t] for t in tables] == [len(of_range(ids, 4, 7))] * 3
    # A range over both shards now: 2-3 from a, 4-5 from b.
    async with ShardMover.opened(settings.pg, batch=5) as mover:
        second = await mover.move("2-5", "c")
    assert second.sources == {"a": "2-3", "b": "4-5"}
    on_c = of_range(ids, 2, 5)
    assert second.sagas == len(on_c)
    found = {name: await _extra_rows(t) for name, t in (("a", a), ("b", b), ("c", pg))}
    expected = {"a": of_range(ids, 0, 1), "b": of_range(ids, 6, 7), "c": on_c}
    for name, saga_ids in expected.items():
        assert found[name]["refs"] == saga_ids, name
        assert found[name]["archive"] == saga_ids, name
        assert found[name]["slots"] == saga_ids, name
        assert found[name]["facts"] == saga_ids, name
        # each shard has the blobs of its references (the sources' copies are swept later)
        assert {f"d-{i}" for i in saga_ids} <= found[name]["blobs"], name
    held = await rows(pg, "SELECT key, held FROM saga_key_slots")
    assert {r["key"]: r["held"] for r in held} == {i: ids.index(i) % 2 == 0 for i in on_c}
    archived = await rows(pg, "SELECT saga_id, history FROM saga_archive")
    assert all(r["history"] == r["saga_id"].encode() for r in archived)
    assert await fence(a) == {0: "active", 1: "active"}
    assert await fence(b) == {6: "active", 7: "active"}
    assert await fence(pg) == dict.fromkeys(range(2, 6), "active")
    assert await moving(pg) == (3, None)


class _FactDuringCopy(ShardMover):
    """A mover during whose copy a fact of a new key of the range arrives on the source
    (a write the fence does not stop)."""

    fact_key = ""
    source: PgTarget | None = None

    async def _copy(self, *args: Any, **kwargs: Any) -> None:
        await super()._copy(*args, **kwargs)
        if self.source is not None:
            await rows(
                self.source,
                "INSERT INTO saga_domain_events (source, event_id, key, payload, received_at, "
                f"expires_at) VALUES ('p', 'late', '{self.fact_key}', '{{}}', now(), now())",
            )
            self.source = None


@pytest.mark.integration
async def test_a_range_whose_rows_change_during_the_copy_is_not_committed(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    settings = settings_of(pg, pg_shards)
    ids = await write_sagas(settings, 10)
    a, _ = pg_shards
    _FactDuringCopy.fact_key = next(f"k{n}" for n in range(100) if partition_for(f"k{n}", 8) >= 4)
    _FactDuringCopy.source = a
    async with _FactDuringCopy.opened(settings.pg) as mover:
        with pytest.raises(ShardMapError, match="changed during the copy"):
            await mover.move("4-7", "b")
    assert await moving(pg) != (1, None)  # recorded, not committed: the old map in force
    assert (await moving(pg))[0] == 1
    async with ShardMover.opened(settings.pg) as mover:  # run again: the fact is copied
        report = await mover.move("4-7", "b")
    assert report.rows["saga_domain_events"] == 1
    assert await in_shard(pg_shards[1]) == of_range(ids, 4, 7)
