"""``saga shard status`` and ``saga migrate`` past one database (issue 43), on real
Postgres clusters: the control database on the first (the test's ``pg``), the shards on
the two more that ``make test`` starts (``pg_shards``). A database that does not answer
(a port nothing listens on: the session's clusters are shared with the tests running
beside this one, so none is stopped here) is a row saying why and exit code 1, never a
traceback."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import orjson
import pytest
from pydantic import SecretStr

from saga_engine import SagaStatus
from saga_engine.events import SagaStarted
from saga_engine.settings import PostgresSettings
from saga_engine.store import NewSaga, PostgresEventStore, Projection, migrate, shipped_migrations
from tests.cli.conftest import as_json, invoke
from tests.conftest import PgTarget
from tests.doc_blocks import code_blocks

pytestmark = pytest.mark.integration

LATEST = shipped_migrations()[-1].version
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _dead_dsn() -> str:
    """The address of a Postgres that is not there: a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/saga"


def _sharded_env(pg: PgTarget, a: str, b: str, **more: str) -> dict[str, str]:
    shards = [
        {"name": "a", "partitions": "0-3", "dsn": a},
        {"name": "b", "partitions": "4-7", "dsn": b},
        *orjson.loads(more.pop("EXTRA", "[]")),
    ]
    return {
        "SAGA_PG__SHARDS": orjson.dumps(shards).decode(),
        "SAGA_PG__CONTROL_DSN": pg.database_dsn,
        "SAGA_PG__DB_SCHEMA": pg.schema,
        "SAGA_KAFKA__PARTITIONS": "8",
        **more,
    }


async def _start_sagas(database_dsn: str, schema: str, running: int, done: int) -> None:
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(database_dsn), db_schema=schema)
    )
    try:
        for i in range(running + done):
            status = SagaStatus.RUNNING if i < running else SagaStatus.COMPLETED
            started = SagaStarted(at=datetime.now(UTC), saga_type="order", input={})
            await store.create(NewSaga(f"s-{i}", "order", [started], Projection(status)))
    finally:
        await store.close()


async def _write_map(dsn: str, data: dict[str, object]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO shard_map (epoch, map) VALUES ($1, $2::text::jsonb)",
            data["epoch"],
            orjson.dumps(data).decode(),
        )
    finally:
        await conn.close()


def test_one_database_is_shown_as_one(pg: PgTarget) -> None:
    asyncio.run(migrate(pg.database_dsn, pg.schema))
    asyncio.run(_start_sagas(pg.database_dsn, pg.schema, running=2, done=1))
    env = {"SAGA_PG__DSN": pg.database_dsn, "SAGA_PG__DB_SCHEMA": pg.schema}

    status = as_json(invoke(["shard", "status", "--json"], env))
    assert status["sharded"] is False
    assert status["all_answer"] is True
    one = status["database"]
    assert (one["name"], one["answers"], one["schema_version"]) == ("database", True, LATEST)
    assert (one["sagas"], one["open_sagas"]) == (3, 2)

    shown = invoke(["shard", "status"], env)
    assert shown.exit_code == 0, shown.output
    assert "one database (no SAGA_PG__SHARDS)" in shown.stdout


def test_migrate_runs_on_the_control_database_and_every_shard(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    a, b = pg_shards
    env = _sharded_env(pg, a.database_dsn, b.database_dsn)

    first = as_json(invoke(["migrate", "--json"], env))
    assert first["schema"] == pg.schema
    reports = {d["name"]: d for d in first["databases"]}
    assert list(reports) == ["control", "a", "b"]
    for report in reports.values():
        assert (report["before"], report["after"], report["error"]) == (None, LATEST, None)
        assert report["applied"] == [m.version for m in shipped_migrations()]

    again = invoke(["migrate"], env)
    assert again.exit_code == 0, again.output
    assert again.stdout.count("up to date") == 3
    assert f"migrations of schema {pg.schema}" in again.stdout


def test_migrate_reports_the_database_that_failed_and_migrates_the_others(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    a, _ = pg_shards
    env = _sharded_env(pg, a.database_dsn, _dead_dsn())

    failed = invoke(["migrate", "--json"], env)
    assert failed.exit_code == 1, failed.output
    reports = {d["name"]: d for d in orjson.loads(failed.stdout)["databases"]}
    assert reports["control"]["after"] == reports["a"]["after"] == LATEST
    assert reports["b"]["after"] is None
    assert reports["b"]["error"].startswith("ConnectionRefusedError")
    assert "1 of 3 databases failed to migrate: b; the others are migrated" in failed.stderr
    assert "Traceback" not in failed.output


def test_shard_status_shows_the_map_and_each_shard(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    a, b = pg_shards
    env = _sharded_env(pg, a.database_dsn, b.database_dsn)
    as_json(invoke(["migrate", "--json"], env))
    asyncio.run(_start_sagas(b.database_dsn, pg.schema, running=1, done=2))

    # Before the first engine's start: the settings' map, said to be so.
    before = as_json(invoke(["shard", "status", "--json"], env))
    assert before["map"]["epoch"] is None
    assert "not seeded yet" in before["map"]["source"]
    assert [(s["name"], s["partitions"]) for s in before["shards"]] == [("a", "0-3"), ("b", "4-7")]

    # A stored map wins: epoch 2, after partition 3 moved to b.
    moved = {"epoch": 2, "partitions": 8, "shards": {"a": "0-2", "b": "3-7"}}
    asyncio.run(_write_map(pg.dsn, {**moved, "epoch": 1, "shards": {"a": "0-3", "b": "4-7"}}))
    asyncio.run(_write_map(pg.dsn, moved))
    status = as_json(invoke(["shard", "status", "--json"], env))
    assert status["sharded"] is True
    assert status["all_answer"] is True
    assert (status["map"]["epoch"], status["map"]["source"]) == (2, "control database")
    assert status["partitions"] == 8
    assert status["control"]["answers"] is True
    assert status["control"]["schema_version"] == LATEST
    rows = {s["name"]: s for s in status["shards"]}
    assert rows["a"]["partitions"] == "0-2"
    assert (rows["a"]["sagas"], rows["a"]["open_sagas"]) == (0, 0)
    assert rows["b"]["partitions"] == "3-7"
    assert (rows["b"]["sagas"], rows["b"]["open_sagas"]) == (3, 1)

    shown = invoke(["shard", "status"], env)
    assert shown.exit_code == 0, shown.output
    assert "shard map" in shown.stdout
    assert "control database" in shown.stdout
    assert "3-7" in shown.stdout


def test_a_shard_that_does_not_answer_is_a_row_saying_why(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    a, _ = pg_shards
    env = _sharded_env(pg, a.database_dsn, _dead_dsn())
    asyncio.run(migrate(pg.database_dsn, pg.schema))

    down = invoke(["shard", "status", "--json"], env)
    assert down.exit_code == 1, down.output
    status = orjson.loads(down.stdout)
    assert status["all_answer"] is False
    rows = {s["name"]: s for s in status["shards"]}
    assert rows["a"]["answers"] is True
    assert rows["a"]["schema_version"] is None  # not migrated: shown, not an error
    assert rows["b"]["answers"] is False
    assert rows["b"]["reason"].startswith("ConnectionRefusedError")
    assert rows["b"]["partitions"] == "4-7"

    shown = invoke(["shard", "status"], env)
    assert shown.exit_code == 1
    assert "no: ConnectionRefusedError" in shown.stdout
    assert "not migrated" in shown.stdout
    assert "Traceback" not in shown.output


def test_a_control_database_that_does_not_answer_leaves_the_settings_map(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    a, b = pg_shards
    env = {**_sharded_env(pg, a.database_dsn, b.database_dsn), "SAGA_PG__CONTROL_DSN": _dead_dsn()}

    down = invoke(["shard", "status", "--json"], env)
    assert down.exit_code == 1, down.output
    status = orjson.loads(down.stdout)
    assert status["control"]["answers"] is False
    assert status["map"]["epoch"] is None
    assert status["map"]["source"].startswith("settings (the control database's map: ")
    assert [s["answers"] for s in status["shards"]] == [True, True]


def test_the_operations_guide_runs_as_written(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    """docs/operations.md, "Past one database": its settings make a map of two shards,
    and its commands run on the shards of this test (their addresses in place of the
    example's)."""
    settings, commands = code_blocks(OPERATIONS, "sh", under="## Past one database")
    written = dict(
        line.split("=", 1) for line in settings.code.replace("\n  ", "").splitlines() if line
    )
    shards = orjson.loads(written["SAGA_PG__SHARDS"].strip("'"))
    assert [(s["name"], s["partitions"]) for s in shards] == [("a", "0-31"), ("b", "32-63")]
    a, b = pg_shards
    shards[0]["dsn"], shards[1]["dsn"] = a.database_dsn, b.database_dsn
    env = {
        **written,
        "SAGA_PG__SHARDS": orjson.dumps(shards).decode(),
        "SAGA_PG__CONTROL_DSN": pg.database_dsn,
        "SAGA_PG__DB_SCHEMA": pg.schema,
    }
    for line in commands.code.splitlines():
        args = line.split("#", 1)[0].split()
        assert args[0] == "saga", line
        done = invoke(args[1:], env)
        assert done.exit_code == 0, (line, done.output)
    assert orjson.loads(done.stdout)["partitions"] == 64


def test_a_shard_of_the_stored_map_the_settings_lack_is_a_row_saying_so(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...]
) -> None:
    a, b = pg_shards
    env = _sharded_env(pg, a.database_dsn, b.database_dsn)
    as_json(invoke(["migrate", "--json"], env))
    stored = {"epoch": 3, "partitions": 8, "shards": {"a": "0-3", "b": "4-5", "c": "6-7"}}
    asyncio.run(_write_map(pg.dsn, stored))

    lacking = invoke(["shard", "status", "--json"], env)
    assert lacking.exit_code == 1, lacking.output
    rows = {s["name"]: s for s in orjson.loads(lacking.stdout)["shards"]}
    assert (rows["c"]["answers"], rows["c"]["partitions"]) == (False, "6-7")
    assert rows["c"]["reason"] == "no DSN in SAGA_PG__SHARDS"
    assert rows["b"]["partitions"] == "4-5"
