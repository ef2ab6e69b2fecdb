"""Schema migrations: pinned, idempotent, safe to run from several engines at once."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import orjson
import pytest
from pydantic import SecretStr

from saga_engine.core.history._events import (
    Event,
    EventAwaited,
    ParentLink,
    RunContinued,
    SagaStarted,
    TimerFired,
    event_to_json,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.planning._replay import HistoryExport, load_history, replay
from saga_engine.kernel._errors import MigrationBusy, MigrationError, PermanentError
from saga_engine.kernel._partitioning import key_hash, partition_for
from saga_engine.settings import PostgresSettings
from saga_engine.store import _migrations
from saga_engine.store._migrations import (
    PARTICIPANT_MIGRATIONS,
    Migration,
    migrate,
    migration_sql,
    shipped_migrations,
)
from saga_engine.store._pgdomain import PostgresDomainEventStore
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._store import Append, NewSaga, Projection, RunSpan, SagaFilter
from tests.conftest import PgTarget

# A released migration must never change: a database that applied the old text would no
# longer match the code. If this test fails because you edited a shipped migration,
# revert the edit and add a new, higher-numbered migration instead. Add a line here for
# each new migration.
PINNED = {
    1: "12bd630585402c6947d0c31bcc4f0501dac21a8c9953ae6c07fb9c978d764ee2",
    2: "be285e3e14a6051c8769902f72d392f6ad3a382597dc084acb9a755278f03f73",
    3: "041235596d84fb456126190a2878c864685b1de54f875c551d4d1f9850697cea",
    4: "fd174fdd2c4a14dd90c3ee3abbbb21eb8ddeb7daaa839b011dc59650715c80d0",
    5: "1a55c6d1f920ca6f3f9d03b73ed16ce85eff1b840a9ef5cab498520dad63b6c3",
    6: "d5218c23c71101864c49e98646db6f0d3260f9f57c993a114be2fea85393ed43",
    7: "042dbd4a9ef1216c538b02152752802e6cd9a13563cfadb44cc94eed00841ddd",
    8: "6b5e5ac1eceb0d406e9549e58d1afac717fffcd0bdf0318032cfa2add4020fbe",
    9: "7531663a38f677de142ef288e9c0119ac9c4bef1c77d9cc4e4ac5f599e59ef92",
    10: "6dfe12e1a8ec2ebc30ec97e9a8d1a2d95b268708d05ca356ca499731e28a00cd",
    11: "f5fcd492645906cf20c0839810ca38a5dd9e6158b85076a4897e31bb32ed52f0",
    12: "e2682de323ca5b12e62cd6d8213e812f57bf372e07606b18337b6467f0934fbe",
    13: "6331cb93dd6c1cba6af455a573b8a494685d1c51b5a6ba3ba82fbf5ea70180d9",
    14: "ba93ec13d9447d5acf59bc159e4d3aaa27ba7062cfb84801731a63dc7d2a9f38",
    15: "ad7b74fbb1eee375eaaf0d7728a2906d7409efaead7c6b06b7790cee8d3ce977",
    16: "0fccc5716ec2b7f420ac5e1be4ae3e45da4a4a3baba273fab189036150c4f03c",
    17: "5166a02f524ebddb451138b96ff775ab6c922e1c8ecd0d0124d3714351603745",
    18: "ba7b4430241495b812c4397d3e74bc6230662aaaba8bb8c3d82e476805c3d52f",
    19: "4862f475c7a0469b588a77d0b9354e8a99d4818ce3f2842e858aa015411eec55",
    20: "8cd4505a3277431854688359a1d02d45fa358bc31c9cd126e32cc4d62cb80154",
    21: "8de84bb35d40889e047ec0f8a1cbfad9b1da54290ba4d2d7b840f8a1eb723e9b",
    22: "75c37b60e3a4f87e3cd3835f6360c930bade8aef90afc12ff6ed5a4e5016045c",
    23: "8038ecc5f7aa29164dfd4330621ff42b78283b7bcf1c40df9197db810141f96d",
    24: "207b366aa75a818b9823833757e4a2863349b4c85564e07f5581e077a027d42c",
    25: "d661ca771056aaf8a7a540580f3b4b237479bf982aad19cc2b5339a2ea613338",
}
# The same rule for the participant kit's migrations (saga_engine/participant/migrations).
PINNED_PARTICIPANT = {
    1: "cff0612d825b9868ebcd4f955f765cd36a21b437cbf52095dfa198d677d93d4c",
    2: "3159734dac79d7eed52885ec673c7f53a5bd2acca810562cb6967a327f81e1c3",
}


#: Every shipped engine migration's version: what a fresh schema gets.
ALL = sorted(PINNED)
#: The shipped migrations, read before any test replaces the function.
_ALL_SHIPPED = shipped_migrations()


def test_shipped_migrations_are_pinned() -> None:
    shipped = shipped_migrations()
    assert {m.version: m.sha256 for m in shipped} == PINNED
    assert [m.version for m in shipped] == list(range(1, len(shipped) + 1))
    for m in shipped:
        assert hashlib.sha256(m.sql.encode()).hexdigest() == m.sha256
    assert shipped[0].name == "initial"


def test_participant_migrations_are_pinned() -> None:
    shipped = shipped_migrations(package=PARTICIPANT_MIGRATIONS)
    assert {m.version: m.sha256 for m in shipped} == PINNED_PARTICIPANT
    assert [m.version for m in shipped] == list(range(1, len(shipped) + 1))
    assert shipped[0].name == "participant"
    sql = migration_sql(package=PARTICIPANT_MIGRATIONS)
    assert "CREATE TABLE saga_processed_commands" in sql
    assert "CREATE TABLE sagas" not in sql


def test_migration_sql_holds_every_migration_and_its_bookkeeping() -> None:
    sql = migration_sql()
    assert "CREATE TABLE sagas" in sql
    assert "CREATE TABLE saga_events" in sql
    assert "CREATE TABLE IF NOT EXISTS schema_migrations" in sql
    for m in shipped_migrations():
        assert m.sql.strip() in sql
        assert f"VALUES ({m.version}, '{m.name}', '{m.sha256}')" in sql


@pytest.fixture
async def fresh_schema(pg_database: str) -> AsyncIterator[str]:
    """A schema name that does not exist yet (dropped afterwards if a test created it)."""
    name = f"m_{uuid.uuid4().hex[:12]}"
    yield name
    conn = await asyncpg.connect(pg_database)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


async def _recorded(dsn: str, schema: str) -> list[tuple[int, str, str]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            f'SELECT version, name, sha256 FROM "{schema}".schema_migrations ORDER BY version'
        )
    finally:
        await conn.close()
    return [(r["version"], r["name"], r["sha256"]) for r in rows]


async def _tables(dsn: str, schema: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)
    finally:
        await conn.close()
    return {r["tablename"] for r in rows}


async def test_migrate_applies_each_migration_once(pg: PgTarget) -> None:
    messages: list[str] = []

    assert await migrate(pg.database_dsn, pg.schema, progress=messages.append) == ALL

    assert any("applying 0001_initial" in m for m in messages)
    assert await _tables(pg.database_dsn, pg.schema) == {
        "schema_migrations",
        "saga_archive",
        "saga_schedules",
        "sagas",
        "saga_decisions",  # 0022 (saga_events: a view of it)
        "saga_rollouts",  # 0008
        "saga_rollout_audit",  # 0008
        "saga_schedule_sends",  # 0009
        "saga_domain_events",  # 0011
        "saga_key_slots",  # 0012
        "saga_batch_operations",  # 0013
        "saga_insights",  # 0014
        "saga_insights_pending",  # 0015
        "saga_insights_ended",  # 0021
        "shard_map",  # 0023
        "shard_partitions",  # 0024
        "saga_blobs",  # 0018
        "saga_blob_refs",  # 0018
    }
    assert await _recorded(pg.database_dsn, pg.schema) == [
        (m.version, m.name, m.sha256) for m in shipped_migrations()
    ]

    # The second run finds nothing to do.
    messages.clear()
    assert await migrate(pg.database_dsn, pg.schema, progress=messages.append) == []
    assert not any("applying" in m for m in messages)
    assert len(await _recorded(pg.database_dsn, pg.schema)) == len(shipped_migrations())


async def test_migrate_creates_a_missing_schema(pg_database: str, fresh_schema: str) -> None:
    assert await _tables(pg_database, fresh_schema) == set()
    assert await migrate(pg_database, fresh_schema) == ALL
    assert {"sagas", "saga_decisions"} <= await _tables(pg_database, fresh_schema)


async def test_concurrent_migrate_applies_each_migration_once(
    pg_database: str, fresh_schema: str
) -> None:
    conns = [await asyncpg.connect(pg_database) for _ in range(3)]
    try:
        results = await asyncio.gather(*(migrate(c, fresh_schema) for c in conns))
    finally:
        for c in conns:
            await c.close()

    # Each migration is its own transaction: the runners may share them out, but each is
    # applied exactly once.
    assert sorted(v for applied in results for v in applied) == ALL
    assert [v for v, _, _ in await _recorded(pg_database, fresh_schema)] == ALL


async def test_migrate_leaves_the_callers_connection_as_it_was(pg: PgTarget) -> None:
    conn = await asyncpg.connect(pg.database_dsn)
    try:
        before = await conn.fetchval("SHOW search_path")
        assert await migrate(conn, pg.schema) == ALL
        assert await conn.fetchval("SHOW search_path") == before
        assert not conn.is_in_transaction()
    finally:
        await conn.close()


async def test_a_changed_applied_migration_is_refused(pg: PgTarget) -> None:
    assert await migrate(pg.database_dsn, pg.schema) == ALL
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute("UPDATE schema_migrations SET sha256 = 'f00d' WHERE version = 1")
    finally:
        await conn.close()

    with pytest.raises(MigrationError, match="0001_initial") as info:
        await migrate(pg.database_dsn, pg.schema)
    assert isinstance(info.value, PermanentError)
    assert "f00d" in str(info.value)
    assert "never change" in str(info.value)


async def test_a_failing_migration_rolls_back_alone(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = shipped_migrations()
    bad_sql = "CREATE TABLE half_done (x int);\nSELECT * FROM no_such_table;\n"
    bad = Migration(
        good[-1].version + 1, "broken", bad_sql, hashlib.sha256(bad_sql.encode()).hexdigest()
    )
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: [*good, bad])

    with pytest.raises(asyncpg.exceptions.UndefinedTableError):
        await migrate(pg.database_dsn, pg.schema)

    # Each good one committed in its own transaction; the broken one left nothing behind,
    # not even a record.
    assert [v for v, _, _ in await _recorded(pg.database_dsn, pg.schema)] == ALL
    assert "half_done" not in await _tables(pg.database_dsn, pg.schema)

    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: good)
    assert await migrate(pg.database_dsn, pg.schema) == []


async def test_a_migration_from_a_newer_version_is_tolerated(pg: PgTarget) -> None:
    assert await migrate(pg.database_dsn, pg.schema) == ALL
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(
            "INSERT INTO schema_migrations (version, name, sha256) VALUES (999, 'future', 'x')"
        )
    finally:
        await conn.close()

    messages: list[str] = []
    assert await migrate(pg.database_dsn, pg.schema, progress=messages.append) == []
    assert any("0999_future" in m and "newer" in m for m in messages)


async def test_the_sql_script_leaves_nothing_for_migrate_to_do(pg: PgTarget) -> None:
    conn = await asyncpg.connect(pg.database_dsn)
    try:
        async with conn.transaction():
            await conn.execute(f'SET LOCAL search_path TO "{pg.schema}"')
            await conn.execute(migration_sql())
    finally:
        await conn.close()

    assert await migrate(pg.database_dsn, pg.schema) == []
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    try:
        assert await store.list_sagas() == []
    finally:
        await store.close()


async def test_participant_migrations_apply_to_their_own_schema(pg: PgTarget) -> None:
    messages: list[str] = []
    applied = await migrate(
        pg.database_dsn, pg.schema, progress=messages.append, package=PARTICIPANT_MIGRATIONS
    )

    assert applied == sorted(PINNED_PARTICIPANT)
    assert any("applying 0001_participant" in m for m in messages)
    assert await _tables(pg.database_dsn, pg.schema) == {
        "schema_migrations",
        "saga_processed_commands",
        "saga_reply_outbox",
    }
    assert await migrate(pg.database_dsn, pg.schema, package=PARTICIPANT_MIGRATIONS) == []


async def test_0002_upgrades_a_schema_with_sagas_in_it(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store at 0001 with sagas in it takes 0002; its rows stay, and step_stuck (which
    0001's check refused) is accepted from then on, while a bogus status still is not."""
    first = [m for m in shipped_migrations() if m.version == 1]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: first)
    assert await migrate(pg.database_dsn, pg.schema) == [1]
    insert = (
        "INSERT INTO sagas (saga_id, saga_type, status, last_seq, created_at, updated_at) "
        "VALUES ($1, 't', $2, 0, now(), now())"
    )
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(insert, "old", "running")
        with pytest.raises(asyncpg.exceptions.CheckViolationError):
            await conn.execute(insert, "early", "step_stuck")
        monkeypatch.undo()
        assert await migrate(pg.database_dsn, pg.schema) == ALL[1:]
        await conn.execute(insert, "new", "step_stuck")
        with pytest.raises(asyncpg.exceptions.CheckViolationError):
            await conn.execute(insert, "bogus", "stuck-ish")
        rows = await conn.fetch("SELECT saga_id, status FROM sagas ORDER BY saga_id")
    finally:
        await conn.close()
    assert [(r["saga_id"], r["status"]) for r in rows] == [
        ("new", "step_stuck"),
        ("old", "running"),
    ]


async def test_0003_drops_the_events_foreign_key_and_keeps_the_history(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store at 0002 with a saga and its events takes 0003: the history stays, the
    per-event foreign key check is gone, and the primary key still refuses a second event
    at one position."""
    upto2 = [m for m in shipped_migrations() if m.version <= 2]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: upto2)
    assert await migrate(pg.database_dsn, pg.schema) == [1, 2]
    fk = (
        "SELECT count(*) FROM pg_constraint WHERE conrelid = 'saga_events'::regclass "
        "AND contype = 'f'"
    )
    event = "INSERT INTO saga_events (saga_id, seq, kind, data) VALUES ($1, $2, 'k', '{}')"
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(
            "INSERT INTO sagas (saga_id, saga_type, status, last_seq, created_at, updated_at) "
            "VALUES ('s', 't', 'running', 1, now(), now())"
        )
        await conn.execute(event, "s", 1)
        assert await conn.fetchval(fk) == 1
        with pytest.raises(asyncpg.exceptions.ForeignKeyViolationError):
            await conn.execute(event, "nobody", 1)
        monkeypatch.undo()
        assert await migrate(pg.database_dsn, pg.schema) == ALL[2:]
        assert await conn.fetchval(fk) == 0
        with pytest.raises(asyncpg.exceptions.UniqueViolationError):
            await conn.execute(event, "s", 1)
        rows = await conn.fetch("SELECT saga_id, seq FROM saga_events")
    finally:
        await conn.close()
    assert [(r["saga_id"], r["seq"]) for r in rows] == [("s", 1)]


async def test_0003_gives_up_on_a_held_lock_changing_nothing_and_applies_later(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a long transaction reads the history, 0003 waits for its lock at most its
    lock_timeout, then fails with MigrationBusy (a retryable error naming it), leaving the
    schema at 0002; run again once the reader is done, it applies."""
    upto2 = [m for m in shipped_migrations() if m.version <= 2]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: upto2)
    assert await migrate(pg.database_dsn, pg.schema) == [1, 2]
    monkeypatch.undo()
    reader = await asyncpg.connect(pg.dsn)
    try:
        long_tx = reader.transaction()
        await long_tx.start()
        await reader.fetch("SELECT count(*) FROM saga_events")  # holds ACCESS SHARE
        with pytest.raises(MigrationBusy, match="0003_events_without_foreign_key"):
            await migrate(pg.database_dsn, pg.schema)
        assert [v for v, _, _ in await _recorded(pg.database_dsn, pg.schema)] == [1, 2]
        await long_tx.rollback()
    finally:
        await reader.close()
    assert await migrate(pg.database_dsn, pg.schema) == ALL[2:]


async def test_0004_finds_open_sagas_created_before_it_by_partition(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sagas created at 0003 have no key_hash: after 0004, recovery's query by partition
    still finds the open ones (hashed in Python), and gives them their hash."""
    upto3 = [m for m in shipped_migrations() if m.version <= 3]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: upto3)
    assert await migrate(pg.database_dsn, pg.schema) == [1, 2, 3]
    monkeypatch.undo()
    ids = [f"old-{n}" for n in range(12)]
    conn = await asyncpg.connect(pg.dsn)
    try:
        for saga_id in [*ids, "old-done"]:
            await conn.execute(
                "INSERT INTO sagas (saga_id, saga_type, status, last_seq, created_at, "
                "updated_at) VALUES ($1, 't', $2, 0, now(), now())",
                saga_id,
                "completed" if saga_id == "old-done" else "running",
            )
        assert await migrate(pg.database_dsn, pg.schema) == ALL[3:]
        store = await PostgresEventStore.connect(
            PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
        )
        try:
            mine = {0, 2}
            expected = sorted(i for i in ids if partition_for(i, 3) in mine)
            assert await store.open_saga_ids(mine, 3) == expected
            assert await store.open_saga_ids(mine, 3) == expected  # now by the column
        finally:
            await store.close()
        rows = await conn.fetch("SELECT saga_id, key_hash FROM sagas WHERE key_hash IS NOT NULL")
        hashes = {r["saga_id"]: r["key_hash"] for r in rows}
    finally:
        await conn.close()
    assert hashes == {i: key_hash(i) for i in ids}  # the open ones, and only them


async def test_0017_makes_the_insights_from_before_flow_policy_1s(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Aggregates written at 0016 (no flow policies yet) are policy 1's after 0017; the
    same row of another policy is a row of its own, and the store reads them apart."""
    from datetime import UTC, datetime, timedelta

    from saga_engine.core.views._insights import BUCKETS

    upto16 = [m for m in shipped_migrations() if m.version <= 16]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: upto16)
    assert await migrate(pg.database_dsn, pg.schema) == list(range(1, 17))
    monkeypatch.undo()
    bucket = datetime.now(UTC).replace(second=0, microsecond=0)
    row = (
        "INSERT INTO saga_insights (saga_type, bucket, facet, key, detail, runs, hist{}) "
        "VALUES ('t', $1, 'type', 'completed', '', $2, $3{})"
    )
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(row.format("", ""), bucket, 5, [0] * BUCKETS)
        assert await migrate(pg.database_dsn, pg.schema) == [v for v in ALL if v >= 17]
        assert await conn.fetchval("SELECT flow_policy FROM saga_insights") == 1
        await conn.execute(row.format(", flow_policy", ", 2"), bucket, 3, [0] * BUCKETS)
        with pytest.raises(asyncpg.exceptions.UniqueViolationError):
            await conn.execute(row.format(", flow_policy", ", 1"), bucket, 1, [0] * BUCKETS)
    finally:
        await conn.close()
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    try:
        since, until = bucket - timedelta(hours=1), bucket + timedelta(hours=1)
        assert await store.insight_policies("t", since, until) == {1: 5, 2: 3}
        [(_, _, _, old)] = await store.insight_rows("t", since, until, flow_policy=1)
        assert old.runs == 5
        [(_, _, _, every)] = await store.insight_rows("t", since, until)
        assert every.runs == 8
    finally:
        await store.close()


async def _brin_or_not(
    conn: asyncpg.Connection[asyncpg.Record], schema: str, table: str, like: str = "%"
) -> list[tuple[str, bool]]:
    """The table's indexes whose definition is ``LIKE`` ``like``, by name: each name and
    whether it is a BRIN index."""
    rows = await conn.fetch(
        "SELECT indexname, indexdef LIKE '%USING brin%' AS brin FROM pg_indexes "
        "WHERE schemaname = $1 AND tablename = $2 AND indexdef LIKE $3 ORDER BY indexname",
        schema,
        table,
        like,
    )
    return [(r["indexname"], r["brin"]) for r in rows]


async def test_0020_filters_sagas_created_before_it_by_creation_time(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sagas created at 0019 are listed by a creation-time range through the BRIN index
    0020 builds in place of the btree, as are those created after it."""
    from datetime import UTC, datetime, timedelta

    from saga_engine.store._store import SagaFilter

    upto19 = [m for m in shipped_migrations() if m.version <= 19]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: upto19)
    assert await migrate(pg.database_dsn, pg.schema) == list(range(1, 20))
    monkeypatch.undo()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    insert = (
        "INSERT INTO sagas (saga_id, saga_type, status, last_seq, created_at, updated_at) "
        "VALUES ($1, 't', 'running', 0, $2, $2)"
    )
    conn = await asyncpg.connect(pg.dsn)
    try:
        for n in range(6):
            await conn.execute(insert, f"old-{n}", t0 + timedelta(hours=n))
        assert await migrate(pg.database_dsn, pg.schema) == [v for v in ALL if v >= 20]
        for n in range(6, 9):
            await conn.execute(insert, f"new-{n}", t0 + timedelta(hours=n))
        indexes = await _brin_or_not(conn, pg.schema, "sagas", "%(created_at)%")
    finally:
        await conn.close()
    assert indexes == [("sagas_created_at_brin", True)]
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    try:
        where = SagaFilter(
            created_after=t0 + timedelta(hours=2), created_before=t0 + timedelta(hours=7)
        )
        listed = [r.saga_id for r in await store.list_sagas(where)]
    finally:
        await store.close()
    assert listed == ["new-6", "old-2", "old-3", "old-4", "old-5"]


async def test_participant_0002_prunes_by_processing_time_through_a_brin_index(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows answered under 0001 and after 0002 are pruned by processing time (the
    operator's DELETE) through the BRIN index 0002 builds in place of the btree."""
    first = shipped_migrations(package=PARTICIPANT_MIGRATIONS)[:1]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda package: first)
    assert await migrate(pg.database_dsn, pg.schema, package=PARTICIPANT_MIGRATIONS) == [1]
    monkeypatch.undo()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    insert = (
        "INSERT INTO saga_processed_commands (command_id, saga_id, command_type, step, "
        "outcome, reply, processed_at) VALUES ($1, 's', 'Book', 'book', 'success', '{}', $2)"
    )
    prune = "DELETE FROM saga_processed_commands WHERE processed_at < $1"
    conn = await asyncpg.connect(pg.dsn)
    try:
        for n in range(4):
            await conn.execute(insert, f"old-{n}", t0 + timedelta(hours=n))
        assert await migrate(pg.database_dsn, pg.schema, package=PARTICIPANT_MIGRATIONS) == [2]
        for n in range(4, 8):
            await conn.execute(insert, f"new-{n}", t0 + timedelta(hours=n))
        indexes = await _brin_or_not(conn, pg.schema, "saga_processed_commands")
        async with conn.transaction():
            await conn.execute("SET LOCAL enable_seqscan = off")
            plan = "\n".join(
                r[0] for r in await conn.fetch(f"EXPLAIN {prune}", t0 + timedelta(hours=6))
            )
        await conn.execute(prune, t0 + timedelta(hours=6))
        left = await conn.fetch("SELECT command_id FROM saga_processed_commands ORDER BY 1")
    finally:
        await conn.close()
    assert indexes == [
        ("saga_processed_commands_pkey", False),
        ("saga_processed_commands_processed_at_brin", True),
    ]
    assert "Bitmap Index Scan on saga_processed_commands_processed_at_brin" in plan
    assert [r["command_id"] for r in left] == ["new-6", "new-7"]


async def test_0025_finds_the_open_sagas_through_the_status_index(pg: PgTarget) -> None:
    """Without the partial index on the open sagas' key_hash, every query that read it
    reads (status, saga_id): recovery's open sagas (all, and of some partitions), the
    open summary, the activity listing's open branch; each still answers right."""
    assert await migrate(pg.database_dsn, pg.schema) == ALL
    conn = await asyncpg.connect(pg.dsn)
    try:
        # 20,000 sagas, one in 20 running, one in 97 parked, the rest completed.
        await conn.execute(
            "INSERT INTO sagas (saga_id, saga_type, status, last_seq, created_at, updated_at, "
            "key_hash, ended_at) "
            "SELECT lpad(g::text, 6, '0'), 't', CASE WHEN g % 20 = 0 THEN 'running' "
            "WHEN g % 97 = 0 THEN 'step_stuck' ELSE 'completed' END, 1, "
            "now() - make_interval(secs => g), now() - make_interval(secs => g), g, "
            "CASE WHEN g % 20 <> 0 AND g % 97 <> 0 THEN now() - make_interval(secs => g) END "
            "FROM generate_series(1, 20000) AS g"
        )
        await conn.execute("ANALYZE sagas")
        indexes = await conn.fetch(
            "SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = 'sagas'",
            pg.schema,
        )
    finally:
        await conn.close()
    assert "sagas_open_key_hash_idx" not in {r["indexname"] for r in indexes}
    store = await PostgresEventStore.connect(
        PostgresSettings(
            dsn=SecretStr(pg.database_dsn), db_schema=pg.schema, pool_min_size=1, pool_max_size=1
        )
    )
    queries: list[tuple[str, tuple[object, ...]]] = []
    try:
        async with store._pool.acquire() as held:
            held.add_query_logger(lambda q: queries.append((q.query, tuple(q.args))))
        everyone = await store.open_saga_ids()
        mine = await store.open_saga_ids([1, 3], 4)
        summary = await store.open_summary()
        running = await store.list_sagas(
            SagaFilter(statuses=frozenset({SagaStatus.RUNNING})), order="activity", limit=3
        )
        plans = []
        async with store._pool.acquire() as held:
            for query, args in list(queries):  # not the EXPLAINs logged meanwhile
                if "FROM sagas" not in query or ";" in query:
                    continue  # the pool's own statements
                rows = await held.fetch("EXPLAIN (COSTS true) " + query, *args)
                plans.append("\n".join(r[0] for r in rows))
    finally:
        await store.close()
    opened = {n for n in range(1, 20001) if n % 20 == 0 or n % 97 == 0}
    assert everyone == [f"{n:06d}" for n in sorted(opened)]
    assert mine == [f"{n:06d}" for n in sorted(opened) if n % 4 in (1, 3)]
    assert summary.by_status == {SagaStatus.RUNNING: 1000, SagaStatus.STEP_STUCK: 196}
    assert [r.saga_id for r in running] == ["000020", "000040", "000060"]
    assert len(plans) == 5, plans  # open_saga_ids twice, open_summary's two, the listing
    for plan in plans:
        assert "sagas_status_id_idx" in plan, plan


async def test_0021_rolls_up_the_runs_an_older_engine_recorded_once(pg: PgTarget) -> None:
    """Runs recorded one row each in 0015's table (an engine of the release before 0021,
    running while it is deployed) are rolled up beside those 0021's table records a
    transaction at a time (a transaction's runs together), each run once."""
    from tests.internal.contract.test_insight_store import _happy, _report, _run

    await migrate(pg.database_dsn, pg.schema)
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    conn = await asyncpg.connect(pg.dsn)
    try:
        for saga in ("a", "b", "c"):
            await _run(store, saga, _happy(saga), SagaStatus.COMPLETED)
        # "a" and "b" ended by one transaction; "c" as the older engine recorded it.
        await conn.execute("DELETE FROM saga_insights_ended")
        await conn.execute("INSERT INTO saga_insights_ended (saga_ids) VALUES (ARRAY['a', 'b'])")
        await conn.execute("INSERT INTO saga_insights_pending (saga_id) VALUES ('c')")
        # One row of each table: a transaction's runs are taken together.
        assert await store.roll_up_insights(1) == 3
        assert await store.roll_up_insights() == 0
        assert (await _report(store))["outcomes"] == {"completed": 3}
        left = await conn.fetchval(
            "SELECT (SELECT count(*) FROM saga_insights_ended) "
            "+ (SELECT count(*) FROM saga_insights_pending)"
        )
    finally:
        await conn.close()
        await store.close()
    assert left == 0


async def test_the_store_refuses_an_unmigrated_schema(pg: PgTarget) -> None:
    settings = PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    with pytest.raises(MigrationError, match="saga migrate"):
        await PostgresEventStore.connect(settings)


async def test_0008_keeps_the_rollout_audit_append_only(pg: PgTarget) -> None:
    """The audit trail of rollouts cannot be rewritten, even by SQL (a trigger refuses it)."""
    from datetime import UTC, datetime

    from saga_engine.core.planning._rollout import RolloutSpec

    await migrate(pg.database_dsn, pg.schema)
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    try:
        await store.set_rollout(
            "order",
            RolloutSpec(version=2),
            principal="o",
            reason="r",
            at=datetime(2026, 3, 1, tzinfo=UTC),
        )
    finally:
        await store.close()
    conn = await asyncpg.connect(pg.dsn)
    try:
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("UPDATE saga_rollout_audit SET reason = 'rewritten'")
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute("DELETE FROM saga_rollout_audit")
        assert await conn.fetchval("SELECT reason FROM saga_rollout_audit") == "r"
    finally:
        await conn.close()


async def _write_at_0021(
    conn: asyncpg.Connection[asyncpg.Record], saga_id: str, appends: list[list[Event]]
) -> None:
    """A saga's history as the store of 0021 wrote it: one row per event, each append's
    events in one transaction (one recorded_at), and the saga row's last_seq."""
    await conn.execute(
        "INSERT INTO sagas (saga_id, saga_type, status, last_seq, created_at, updated_at) "
        "VALUES ($1, 't', 'running', 0, now(), now())",
        saga_id,
    )
    seq = 0
    for events in appends:
        async with conn.transaction():
            for event in events:
                seq += 1
                await conn.execute(
                    "INSERT INTO saga_events (saga_id, seq, kind, data) VALUES ($1, $2, $3, $4)",
                    saga_id,
                    seq,
                    event.kind,
                    event_to_json(event).decode(),
                )
            await conn.execute("UPDATE sagas SET last_seq = $2 WHERE saga_id = $1", saga_id, seq)


async def test_0022_moves_the_histories_into_one_row_per_decision(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Histories written at 0021 (one row per event) are one row per transaction's run
    of events after 0022, and read the same through every read of the store: whole,
    after a seq, by kind, the current run and the runs, the first event, the listing's
    parent, the waits for domain events; the store appends after them, and an engine of
    the release before, writing one row per event through the view, is read too."""
    upto21 = [m for m in shipped_migrations() if m.version <= 21]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: upto21)
    assert await migrate(pg.database_dsn, pg.schema) == list(range(1, 22))
    monkeypatch.undo()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    start = SagaStarted(at=at, saga_type="t", input={})
    child = SagaStarted(
        at=at, saga_type="t", input={}, parent=ParentLink(saga_id="p", command_id="x")
    )
    fired = [TimerFired(at=at, timer_id=f"t{n}") for n in range(6)]
    histories: dict[str, list[list[Event]]] = {
        "p": [[start, fired[0]], [fired[1], fired[2], fired[3]], [fired[4]]],
        "c": [[child], [fired[0], fired[1]]],
        "runs": [
            [start, fired[0]],
            [RunContinued(at=at, run=2, first_seq=3, input={}), fired[1]],
            [fired[2], RunContinued(at=at, run=3, first_seq=6, input={})],
            [fired[3]],
        ],
        "waits": [[start, EventAwaited(at=at, wait_id="w", source="orders", key="o-1")]],
    }
    conn = await asyncpg.connect(pg.dsn)
    try:
        for saga_id, appends in histories.items():
            await _write_at_0021(conn, saga_id, appends)
        # Per event, each in a transaction of its own: one row per event after 0022.
        await _write_at_0021(conn, "single", [[start], [fired[0]], [fired[1]]])
        histories["single"] = [[start], [fired[0]], [fired[1]]]
        assert await migrate(pg.database_dsn, pg.schema) == ALL[21:]
        spans = await conn.fetch("SELECT saga_id, seq, last_seq FROM saga_decisions ORDER BY 1, 2")
        # An engine of 0021 still running: its one row per event, through the view.
        await conn.execute(
            "INSERT INTO saga_events (saga_id, seq, kind, data) VALUES ('single', 4, $1, $2)",
            fired[2].kind,
            event_to_json(fired[2]).decode(),
        )
        await conn.execute("UPDATE sagas SET last_seq = 4 WHERE saga_id = 'single'")
    finally:
        await conn.close()
    assert [(r["saga_id"], r["seq"], r["last_seq"]) for r in spans] == [
        ("c", 1, 1),
        ("c", 2, 3),
        ("p", 1, 2),
        ("p", 3, 5),
        ("p", 6, 6),
        ("runs", 1, 2),
        ("runs", 3, 4),
        ("runs", 5, 6),
        ("runs", 7, 7),
        ("single", 1, 1),
        ("single", 2, 2),
        ("single", 3, 3),
        ("waits", 1, 2),
    ]
    histories["single"].append([fired[2]])
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    domain = await PostgresDomainEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    try:
        for saga_id, appends in histories.items():
            written = [e for events in appends for e in events]
            loaded = await store.load(saga_id)
            assert [(s.seq, s.event) for s in loaded.events] == list(enumerate(written, 1))
            after = await store.load_after(saga_id, 2)
            assert [(s.seq, s.event) for s in after.events] == list(enumerate(written, 1))[2:]
            assert (await store.first_event(saga_id)).event == written[0]
        fired_only = await store.load_after("p", 1, kinds=["timer_fired"])
        assert [s.seq for s in fired_only.events] == [2, 3, 4, 5, 6]
        assert [s.seq for s in (await store.load_run("runs")).events] == [1, 6, 7]
        assert await store.runs("runs") == [RunSpan(1, 1, 2), RunSpan(2, 3, 3), RunSpan(3, 6, 2)]
        assert await domain.waiting("orders", "o-1") == ["waits"]
        assert await domain.waiting("orders", "o-2") == []
        roots = [r.saga_id for r in await store.list_sagas(SagaFilter(roots_only=True))]
        assert roots == ["p", "runs", "single", "waits"]
        # Ended; the parent keeps its child from retention (its first event names it).
        await store._pool.execute(
            "UPDATE sagas SET status = 'completed', ended_at = $1 WHERE saga_id IN ('c', 'single')",
            at,
        )
        assert await store.finished_before(at + timedelta(days=1)) == ["single"]
        assert await store.append(Append("p", 6, [fired[5]], Projection(SagaStatus.RUNNING))) == 7
        assert [s.seq for s in (await store.load("p")).events] == [1, 2, 3, 4, 5, 6, 7]
    finally:
        await domain.close()
        await store.close()


async def test_0022_golden_histories_replay_from_both_shapes(
    pg: PgTarget, fresh_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The golden histories, stored as they were recorded (older event versions
    included) one row per event at 0021 and moved by 0022, and written again by today's
    store as decision rows (another schema: a callback's URL derives from the saga's id),
    load back as the goldens' events and replay."""
    from tests.replay.test_golden_histories import CALLBACK_KEYS, GOOD, SAGAS

    upto21 = [m for m in shipped_migrations() if m.version <= 21]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: upto21)
    assert await migrate(pg.database_dsn, pg.schema) == list(range(1, 22))
    monkeypatch.undo()
    goldens = {path: load_history(path) for path in GOOD}
    conn = await asyncpg.connect(pg.dsn)
    try:
        for path, golden in goldens.items():
            stored = orjson.loads(path.read_bytes())["events"]
            await conn.execute(
                "INSERT INTO sagas (saga_id, saga_type, status, last_seq, created_at, "
                "updated_at) VALUES ($1, $2, 'running', $3, now(), now())",
                golden.saga_id,
                golden.saga_type,
                len(stored),
            )
            for first in range(0, len(stored), 3):  # three events a transaction
                async with conn.transaction():
                    for event in stored[first : first + 3]:
                        await conn.execute(
                            "INSERT INTO saga_events (saga_id, seq, kind, data) "
                            "VALUES ($1, $2, $3, $4)",
                            golden.saga_id,
                            event.pop("seq"),
                            event["kind"],
                            orjson.dumps(event).decode(),
                        )
    finally:
        await conn.close()
    assert await migrate(pg.database_dsn, pg.schema) == ALL[21:]
    assert await migrate(pg.database_dsn, fresh_schema) == ALL
    old, new = [
        await PostgresEventStore.connect(
            PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=schema)
        )
        for schema in (pg.schema, fresh_schema)
    ]
    try:
        for golden in goldens.values():
            events = golden.events
            running = Projection(SagaStatus.RUNNING)
            assert await new.create(NewSaga(golden.saga_id, golden.saga_type, events[:1], running))
            for first in range(1, len(events), 2):  # two events an append
                await new.append(Append(golden.saga_id, first, events[first : first + 2], running))
            for store in (old, new):
                loaded = [s.event for s in (await store.load(golden.saga_id)).events]
                assert loaded == events
                history = HistoryExport(golden.saga_id, golden.saga_type, loaded)
                result = replay(SAGAS, history, callbacks=CALLBACK_KEYS)
                assert result.deterministic, result.error
                assert result.status.is_terminal
    finally:
        await old.close()
        await new.close()


async def test_0022_gives_up_on_a_held_lock_changing_nothing_and_applies_later(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a long transaction reads the history, 0022 waits for its lock at most its
    lock_timeout, then fails with MigrationBusy, leaving the schema at 0021 and its
    history one row per event; run again once the reader is done, it moves it."""
    upto21 = [m for m in shipped_migrations() if m.version <= 21]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: upto21)
    assert await migrate(pg.database_dsn, pg.schema) == list(range(1, 22))
    monkeypatch.undo()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    reader = await asyncpg.connect(pg.dsn)
    try:
        await _write_at_0021(reader, "s", [[SagaStarted(at=at, saga_type="t", input={})]])
        long_tx = reader.transaction()
        await long_tx.start()
        await reader.fetch("SELECT count(*) FROM saga_events")  # holds ACCESS SHARE
        with pytest.raises(MigrationBusy, match="0022_decision_rows"):
            await migrate(pg.database_dsn, pg.schema)
        assert [v for v, _, _ in await _recorded(pg.database_dsn, pg.schema)] == ALL[:21]
        await long_tx.rollback()
        assert await reader.fetchval("SELECT to_regclass('saga_decisions')") is None
        assert await migrate(pg.database_dsn, pg.schema) == ALL[21:]
        moved = await reader.fetch("SELECT saga_id, seq, kind FROM saga_events")
    finally:
        await reader.close()
    assert [tuple(r) for r in moved] == [("s", 1, "saga_started")]


async def test_0022_interrupted_after_the_move_leaves_0021_as_it_was(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0022 is one transaction: failing after it moved the histories and dropped the old
    table (as a crash there would), it leaves the schema at 0021, the history one row
    per event in its table; run again, it moves it."""
    upto21 = [m for m in shipped_migrations() if m.version <= 21]
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: upto21)
    assert await migrate(pg.database_dsn, pg.schema) == list(range(1, 22))
    shipped = next(m for m in _ALL_SHIPPED if m.version == 22)
    broken_sql = shipped.sql + "\nSELECT 1 / 0;\n"
    broken = Migration(
        22, shipped.name, broken_sql, hashlib.sha256(broken_sql.encode()).hexdigest()
    )
    monkeypatch.setattr(_migrations, "shipped_migrations", lambda: [*upto21, broken])
    at = datetime(2026, 1, 1, tzinfo=UTC)
    started = SagaStarted(at=at, saga_type="t", input={})
    conn = await asyncpg.connect(pg.dsn)
    try:
        await _write_at_0021(conn, "s", [[started, TimerFired(at=at, timer_id="a")]])
        with pytest.raises(asyncpg.exceptions.DivisionByZeroError):
            await migrate(pg.database_dsn, pg.schema)
        kind = await conn.fetchval(
            "SELECT relkind::text FROM pg_class WHERE oid = to_regclass('saga_events')"
        )
        assert kind == "r"  # still the table
        assert await conn.fetchval("SELECT to_regclass('saga_decisions')") is None
        monkeypatch.undo()
        assert await migrate(pg.database_dsn, pg.schema) == ALL[21:]
        moved = await conn.fetch("SELECT saga_id, seq, last_seq, kinds FROM saga_decisions")
    finally:
        await conn.close()
    assert [tuple(r) for r in moved] == [("s", 1, 2, ["saga_started", "timer_fired"])]
