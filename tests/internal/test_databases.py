"""The databases of a deployment (store/_databases.py) on real Postgres clusters: the one
database, or the control database and every shard; ``migrate_everywhere`` (the engine's
auto-migrate) migrates each and raises the first failure as it was, after the others
had their turn, so that an unreachable shard makes the start wait like an unreachable
Postgres does."""

from __future__ import annotations

import socket

import orjson
import pytest

from saga_engine.kernel._retry import is_transient
from saga_engine.kernel._settings import Settings
from saga_engine.store._databases import deployment_databases, migrate_all, migrate_everywhere
from saga_engine.store._migrations import shipped_migrations
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration

LATEST = shipped_migrations()[-1].version


def _settings(pg: PgTarget, *shard_dsns: str) -> Settings:
    shards = [
        {"name": f"s{i}", "partitions": f"{2 * i}-{2 * i + 1}", "dsn": dsn}
        for i, dsn in enumerate(shard_dsns)
    ]
    pg_settings: dict[str, object] = {"dsn": pg.database_dsn, "db_schema": pg.schema}
    if shards:
        pg_settings |= {
            "shards": orjson.loads(orjson.dumps(shards)),
            "control_dsn": pg.database_dsn,
        }
    return Settings(pg=pg_settings, kafka={"partitions": max(2 * len(shards), 1)})


def _dead_dsn() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/saga"


async def test_one_database_is_the_settings_dsn(pg: PgTarget) -> None:
    settings = _settings(pg)
    assert [(d.name, d.role, d.dsn) for d in deployment_databases(settings.pg)] == [
        ("database", "database", pg.database_dsn)
    ]
    [report] = await migrate_everywhere(settings)
    assert (report.name, report.before, report.after, report.ok) == ("database", None, LATEST, True)
    [again] = await migrate_all(settings)
    assert (again.before, again.after, again.applied) == (LATEST, LATEST, ())


async def test_every_shard_and_the_control_database_are_migrated(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    settings = _settings(pg, *(s.database_dsn for s in pg_shards))
    reports = await migrate_everywhere(settings)
    assert [(r.name, r.role) for r in reports] == [
        ("control", "control"),
        ("s0", "shard"),
        ("s1", "shard"),
    ]
    assert all(r.after == LATEST and r.ok for r in reports)
    assert "dsn" not in repr(deployment_databases(settings.pg))  # a secret: never printed


async def test_an_unreachable_shard_fails_the_start_as_transient_after_the_others(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    settings = _settings(pg, pg_shards[0].database_dsn, _dead_dsn())
    with pytest.raises(ConnectionRefusedError) as caught:
        await migrate_everywhere(settings)
    assert is_transient(caught.value)
    reports = await migrate_all(settings)
    assert [r.after for r in reports] == [LATEST, LATEST, None]
    assert reports[2].to_data()["error"].startswith("ConnectionRefusedError")
